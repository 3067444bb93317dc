"""`istanbul devices` and `istanbul kernels check|bench|list` (the verification ladder)."""

from __future__ import annotations

import argparse
import json
import sys
import types

from . import backends, settings, tuned_cache
from .adapters import enumerate_adapters

IMPORTANT_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size",
                    "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                    "max-compute-workgroups-per-dimension", "max-storage-buffers-per-shader-stage",
                    "min-storage-buffer-offset-alignment")


class _BackendChoice(argparse.Action):
    """`--backend X` means $ISTANBUL_BACKEND=X for this process and the ones it starts
    (`istanbul demo`'s service and daemons), so every device the command opens uses it."""

    def __call__(self, parser, namespace, value, option_string=None):
        settings.write("ISTANBUL_BACKEND", value)
        setattr(namespace, self.dest, value)


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """`--adapter`, `--backend` and `--require-gpu` for every subcommand that opens a GPU
    device."""
    parser.add_argument("--adapter", default=None, metavar="A",
                        help="GPU adapter: index from `istanbul devices --backend ...` or a "
                             "name substring (default: $ISTANBUL_ADAPTER, else the first "
                             "discrete GPU, else software Vulkan)")
    parser.add_argument("--backend", choices=backends.CHOICES, default=None,
                        action=_BackendChoice,
                        help="WebGPU backend: wgpu (wgpu-native, naga), dawn (Dawn, Tint; "
                             "pip install 'istanbul[dawn]') or auto: Dawn when installed and "
                             "the adapter offers f16 subgroup matrices, else wgpu (default: "
                             "$ISTANBUL_BACKEND, else auto)")
    parser.add_argument("--require-gpu", action="store_true",
                        help="refuse to start on software Vulkan (lavapipe): for deployments "
                             "where a missing GPU driver must not go unnoticed")


def check_required_gpu(args) -> None:
    """`--require-gpu`: refuse to run on software Vulkan (a container whose NVIDIA ICD is
    missing would otherwise train at CPU speed and look healthy)."""
    if not getattr(args, "require_gpu", False):
        return
    from istanbul_errors import UserFacingError
    from .adapters import choose_adapter
    info, _ = choose_adapter(getattr(args, "adapter", None))
    if info.is_software:
        raise UserFacingError(
            f"--require-gpu: the adapter is software Vulkan, not a GPU: {info.summary()}. "
            "Check the GPU's Vulkan driver (`vulkaninfo --summary`; in containers the NVIDIA "
            "ICD and NVIDIA_DRIVER_CAPABILITIES=compute,graphics,utility), or pick another "
            "with --adapter")


def run_device_command(prog: str, description: str, add_arguments, func, argv=None) -> int:
    """One command that opens a GPU, as a program of its own (`python -m tokenizer_svc`):
    `add_arguments(parser)` declares its flags (with add_device_args), `func(args)` runs it
    and returns the exit code. `-v` logs at debug level; `--require-gpu` is checked first; a
    UserFacingError or a missing adapter is one line on stderr and exit code 1."""
    import logging
    from istanbul_errors import UserFacingError
    from .adapters import NoAdapterError
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_required_gpu(args)
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (UserFacingError, NoAdapterError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1


def register(sub) -> None:
    p = sub.add_parser("devices", help="list GPU adapters with their backend, features, "
                       "subgroup-matrix configurations and limits")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--backend", choices=backends.CHOICES, default=None,
                   help="list this WebGPU backend's adapters (indexes are per backend); "
                        "default ($ISTANBUL_BACKEND, else auto): wgpu's, then Dawn's if "
                        "wgpudawn is installed")
    p.set_defaults(func=cmd_devices)

    k = sub.add_parser("kernels", help="the verification ladder: check or benchmark every kernel")
    ksub = k.add_subparsers(dest="kernels_command", metavar="ACTION", required=True)
    c = ksub.add_parser("check", help="compile, run, correctness and gradient rungs")
    c.add_argument("--kernel", action="append", metavar="NAME",
                   help="kernel name, family or prefix (repeatable; default: all)")
    c.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    c.add_argument("--max-variants", type=int, default=None, metavar="N",
                   help="check each kernel on its first N input variants only (default: all; "
                        "CI's second backend on lavapipe uses 1: every pipeline compiled and "
                        "run once)")
    c.add_argument("--emulate-subgroup-matrix", action="store_true",
                   help="on a device without subgroup matrices (tensor cores) but with "
                        "shader-f16, run the tensor-core kernels with the matrices rewritten "
                        "into plain WGSL (slow, exact; shaders/sgmat_emulation.py): checks their "
                        "indexing and epilogues on a CPU. Without --kernel: only those kernels "
                        "(default: $ISTANBUL_EMULATE_SUBGROUP_MATRIX=1 emulates, all kernels)")
    add_device_args(c)
    c.set_defaults(func=cmd_check)
    b = ksub.add_parser("bench", help="GPU-timestamp benchmark with roofline fractions")
    b.add_argument("--kernel", action="append", metavar="NAME")
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    b.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    b.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="timed runs per kernel (median; default 20 on GPUs, 3 on software)")
    add_device_args(b)
    b.set_defaults(func=cmd_bench)
    l_ = ksub.add_parser("list", help="list registered kernels")
    l_.set_defaults(func=cmd_list)


def format_matrix_config(c: dict) -> str:
    """One subgroup-matrix configuration: `f16->f32 16x16x16 (subgroup 32)`, M x N x K."""
    sizes = sorted({c.get("min_subgroup_size"), c.get("max_subgroup_size")} - {None})
    return (f"{c.get('component_type')}->{c.get('result_component_type')} "
            f"{c.get('m')}x{c.get('n')}x{c.get('k')} (subgroup {'-'.join(map(str, sizes))})")


def cmd_devices(args) -> int:
    from .adapters import NoAdapterError, NO_ADAPTER_HELP
    choice = backends.requested(args.backend)
    names = [choice] if choice != "auto" else \
        ["wgpu"] + (["dawn"] if backends.dawn_installed() else [])
    adapters = []
    for name in names:
        try:
            adapters += enumerate_adapters(name)
        except backends.BackendError:
            if choice != "auto":
                raise
    if not adapters:
        raise NoAdapterError(NO_ADAPTER_HELP)
    if args.json:
        print(json.dumps([{"index": i.index, "name": i.name, "type": i.adapter_type,
                           "software": i.is_software,
                           "webgpu": i.webgpu, "backend": i.backend, "driver": i.driver,
                           "features": list(i.features),
                           "subgroup_matrix_configs": list(i.subgroup_matrix_configs),
                           "limits": i.limits} for i, _ in adapters], indent=2))
        return 0
    for info, _ in adapters:
        print(info.summary())
        print(f"    backend: {info.webgpu} ({backends.load(info.webgpu).compiler})")
        print("    features: " + ", ".join(info.features))
        if info.webgpu == "dawn":
            print("    subgroup-matrix configs: " + (", ".join(
                format_matrix_config(c) for c in info.subgroup_matrix_configs) or "none"))
        for key in IMPORTANT_LIMITS:
            print(f"    {key}: {info.limits.get(key)}")
        print("    tuning cache: " + (", ".join(
            f"{path} ({n} entries{', borrowed' if borrowed else ''})" for path, n, borrowed in
            tuned_cache.sources(types.SimpleNamespace(info=info))) or "none (op defaults)"))
    return 0


def cmd_list(args) -> int:
    from .ladder import load_cases
    for case in load_cases().values():
        print(f"{case.name:<34} {case.family:<12} {case.precision:<10} "
              f"{'grad ' if case.grad else ''}{case.description}")
    return 0


def _select(names):
    from istanbul_errors import UserFacingError
    from .ladder import select
    try:
        return select(names)
    except KeyError as exc:
        raise UserFacingError(exc.args[0]) from None


def cmd_check(args) -> int:
    from .engine import Device
    from .ladder import check_case, device_record, write_json
    from istanbul_errors import UserFacingError
    cases = _select(args.kernel)
    if args.max_variants is not None and args.max_variants < 1:
        raise UserFacingError(f"--max-variants must be >= 1, got {args.max_variants}")
    emulate = True if args.emulate_subgroup_matrix else None
    device = Device(args.adapter, emulate_subgroup_matrix=emulate)
    if args.emulate_subgroup_matrix:
        if not device.emulated_features:
            raise UserFacingError(
                f"--emulate-subgroup-matrix: {device.name} "
                + ("has subgroup matrices: check them for real, without the flag"
                   if device.has("subgroup-matrix") else "lacks shader-f16 to emulate them"))
        if not args.kernel:
            cases = [c for c in cases if "subgroup-matrix" in c.requires]
    emulated = " (subgroup matrices emulated)" if device.emulated_features else ""
    print(f"# kernels check on {device.info.summary()}{emulated}")
    results, failed = [], 0
    for case in cases:
        for r in check_case(device, case, max_variants=args.max_variants):
            print(r.line(), flush=True)
            results.append(r)
            failed += r.ok is False
    skipped = [r for r in results if r.ok is None and r.detail.startswith("skipped:")]
    print(f"# {len(cases)} kernel(s), {failed} failed rung(s)"
          + (f", {len(skipped)} rung(s) {skipped[0].detail}" if skipped else ""))
    if args.json:
        write_json(args.json, {"device": device_record(device),
                               "results": [r.as_json() for r in results]})
    return 1 if failed else 0


def cmd_bench(args) -> int:
    from .engine import Device
    from .ladder import bench_case, device_record, measure_roofline, write_json
    cases = _select(args.kernel)
    device = Device(args.adapter)
    print(f"# kernels bench on {device.info.summary()}")
    roof = measure_roofline(device)
    print(f"# roofline: copy {roof.copy_gbs:.1f} GB/s (read+write); FMA TFLOP/s "
          + ", ".join(f"{k} {v:.2f}" for k, v in roof.fma_tflops.items())
          + "".join(f"; subgroup matrix {k} {v:.1f}" for k, v in roof.matrix_tflops.items()))
    header = f"{'kernel':<34} {'time us':>10} {'GB/s':>9} {'TFLOP/s':>9} {'roofline':>9}  bound"
    print(header)
    rows = []

    def write_outputs():   # after every kernel: an interrupted run still leaves its table
        payload = {"device": device_record(device),
                   "roofline": {"copy_gbs": roof.copy_gbs, "fma_tflops": roof.fma_tflops,
                                "matrix_tflops": roof.matrix_tflops},
                   "kernels": rows}
        if args.json:
            write_json(args.json, payload)
        if args.markdown:
            with open(args.markdown, "w", encoding="utf-8") as fh:
                fh.write(bench_markdown(payload))

    for case in cases:
        try:
            row = bench_case(device, case, roof, repeats=args.repeats)
        except Exception as exc:  # one broken case must not hide the others' numbers
            row = {"kernel": case.name, "skipped": f"error: {type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        if "skipped" in row:
            print(f"{case.name:<34} skipped: {row['skipped']}")
        else:
            print(f"{row['kernel']:<34} {row['us']:>10.1f} {row['gbs']:>9.1f} "
                  f"{row['tflops']:>9.3f} {row['roofline']:>8.1%}  {row['bound']}", flush=True)
        write_outputs()
    write_outputs()
    return 0


def kernels_actions(sub) -> argparse._SubParsersAction:
    """The actions of `istanbul kernels` (after register(sub)), for a command above the house
    to add one: `kernels tune` (trainer_svc/cli_tune.py), whose shapes are the model's."""
    kernels = sub.choices["kernels"]
    return next(a for a in kernels._actions if isinstance(a, argparse._SubParsersAction))


def run_tuning(device, *, dims, attention_shape=None, label="", keys=None, wide=False,
               budget_s=None, out_dir=None, save=True, total_s=None, matmul=True) -> list:
    """Tune the matmuls of `autotune.linear_shapes(**dims)` and the attention kernels at
    `attention_shape` (None: none), save the adapter's cache, and write the result files
    (`label`, e.g. the model preset, is recorded in autotune.json); shared by `istanbul
    kernels tune` and bench/autotune.py."""
    import pathlib
    import shutil
    from . import autotune
    from .ladder import device_record, write_json
    known = autotune.matmul_keys(device)
    for key in keys or ():
        if key not in known:
            raise ValueError(f"unknown or unsupported matmul key {key!r}; this device "
                             f"supports {', '.join(known)}")
    rows = autotune.tune_model(device, dims, attention_shape, keys, wide, budget_s,
                               total_s=total_s, matmul=matmul)
    entries = autotune.rows_to_entries(rows)
    path = tuned_cache.save(device, entries) if save else None
    if path:
        print(f"# cache: {path}")
    if out_dir:
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_json(str(out / "autotune.json"), {"device": device_record(device),
                                                 "preset": label, "entries": entries})
        (out / "autotune.md").write_text(autotune.markdown_table(device, rows),
                                         encoding="utf-8")
        cache_copy = out / (tuned_cache.adapter_key(device) + ".json")
        if path:
            shutil.copyfile(path, cache_copy)
        else:
            tuned_cache.save(device, entries, cache_copy)
        print(f"# wrote {out / 'autotune.md'}, {out / 'autotune.json'}, {cache_copy}")
    return rows


def bench_markdown(payload: dict) -> str:
    dev, roof = payload["device"], payload["roofline"]
    webgpu = f"{dev['webgpu']} ({dev['compiler']}), " if "webgpu" in dev else ""
    lines = [f"# istanbul kernels bench — {dev['adapter']} ({webgpu}{dev['backend']}, "
             f"{dev['driver']})", "",
             f"Roofline measured in the same run: copy {roof['copy_gbs']:.1f} GB/s (read+write); "
             "FMA ceilings " + ", ".join(f"{k} {v:.2f} TFLOP/s" for k, v in
                                          roof["fma_tflops"].items())
             + "".join(f"; subgroup-matrix {k} {v:.1f} TFLOP/s"
                       for k, v in roof.get("matrix_tflops", {}).items()) + ".", "",
             "| kernel | time (us) | GB/s | TFLOP/s | roofline | bound |",
             "|---|---:|---:|---:|---:|---|"]
    for row in payload["kernels"]:
        if "skipped" in row:
            lines.append(f"| {row['kernel']} | skipped: {row['skipped']} | | | | |")
        else:
            lines.append(f"| {row['kernel']} | {row['us']:.1f} | {row['gbs']:.1f} | "
                         f"{row['tflops']:.3f} | {row['roofline']:.1%} | {row['bound']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(1)

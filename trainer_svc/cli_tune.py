"""`istanbul kernels tune`: the tuner of the kernel house (istanbul.shaders.autotune) at one
model preset's shapes (trainer_svc/model/tuning_shapes.py); the fastest configuration per
shape goes into the adapter's tuning cache."""

from __future__ import annotations

from istanbul_errors import UserFacingError
from istanbul.shaders.cli import add_device_args, kernels_actions, run_tuning


def register(sub) -> None:
    t = kernels_actions(sub).add_parser(
        "tune", help="time the tiled kernels' configurations at the model's shapes and cache "
        "the fastest per adapter (shaders/autotune.py)")
    t.add_argument("--preset", default="124m", help="model shapes to tune (124m, small, tiny)")
    t.add_argument("--tokens", type=int, default=None,
                   help="tokens per step, B*T (default: the preset's, 8 x 1024 for 124m)")
    t.add_argument("--key", action="append", metavar="KEY",
                   help="matmul kernel key: nt, nn, tn, nt_w16, nn_w16, nt_h16, and with "
                        "tensor cores nt_w16_sgmat, nn_w16_sgmat, tn_sgmat (repeatable; "
                        "default: all the device supports)")
    t.add_argument("--wide", action="store_true", help="try every configuration (slower)")
    t.add_argument("--no-attention", action="store_true", help="tune the matmuls only")
    t.add_argument("--no-matmul", action="store_true",
                   help="tune the attention kernels only (the f32 kernels' tiles; with tensor "
                        "cores also the backward's widths, keys dq_sgmat and dkv_sgmat)")
    t.add_argument("--budget-s", type=float, default=None,
                   help="stop timing a shape's candidates after this many seconds")
    t.add_argument("--total-s", type=float, default=None,
                   help="time budget of the whole run, shared fairly among the shapes")
    t.add_argument("--out", metavar="DIR", help="also write autotune.json, autotune.md and a "
                   "copy of the adapter's cache file (to commit as shaders/tuned/) into DIR")
    t.add_argument("--no-save", action="store_true",
                   help="do not write the user cache ($ISTANBUL_AUTOTUNE_DIR or "
                        "~/.cache/istanbul/autotune)")
    add_device_args(t)
    t.set_defaults(func=cmd_tune)


def tune_preset(device, preset: str = "124m", tokens: int | None = None, *,
                attention: bool = True, **options) -> list:
    """run_tuning at one training step of `preset` (`options`: run_tuning's keys, wide,
    budget_s, out_dir, save, total_s, matmul); ValueError for an unknown preset or key."""
    from .model.tuning_shapes import model_attention, model_dims
    dims = model_dims(preset, tokens)
    return run_tuning(device, dims=dims, label=preset,
                      attention_shape=model_attention(preset) if attention else None,
                      **options)


def cmd_tune(args) -> int:
    from istanbul.shaders.engine import Device
    device = Device(args.adapter)
    print(f"# kernels tune on {device.info.summary()}")
    try:
        tune_preset(device, args.preset, args.tokens, attention=not args.no_attention,
                    keys=args.key, wide=args.wide, budget_s=args.budget_s, out_dir=args.out,
                    save=not args.no_save, matmul=not args.no_matmul, total_s=args.total_s)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from None
    return 0

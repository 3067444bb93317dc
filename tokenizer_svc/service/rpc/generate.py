"""Regenerate the checked-in Python code for the service's .proto files.

    python -m tokenizer_svc.service.rpc.generate          # rewrite tokenizer_svc/service/rpc/*_pb2*.py
    python -m tokenizer_svc.service.rpc.generate --check  # exit 1 if the checked-in code is stale

The files: proto/istanbul/tokenizer/v1/tokenizer.proto (tokenizer_pb2*) and
proto/tei/v1/tei.proto (tei_pb2*, TEI's tokenizer API). Needs grpcio-tools (a test extra); the
service itself only needs protobuf and grpcio. The output of protoc is post-processed in two
ways, so that it imports under every protobuf and grpcio the project supports (pyproject:
protobuf>=5.27, grpcio>=1.66), not only the exact versions of the generator:

- the protobuf runtime-version gate (`ValidateProtobufRuntimeVersion`) and grpcio's
  `GRPC_GENERATED_VERSION` gate are removed: the code uses only APIs older than both minimums;
- the absolute import of the messages module in the `_grpc` file becomes a relative one (the
  proto package `istanbul.tokenizer.v1` would otherwise collide with the `istanbul` CLI).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ("istanbul/tokenizer/v1/tokenizer.proto", "tei/v1/tei.proto")
PROTO_FILE = PROTO_FILES[0]
OUT_DIR = Path(__file__).resolve().parent
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
GENERATED = tuple(Path(f).stem + suffix for f in PROTO_FILES for suffix in SUFFIXES)


def tools_version() -> str:
    from importlib.metadata import version
    return version("grpcio-tools")


def _post_process(name: str, text: str) -> str:
    banner = (f"# Post-processed by tokenizer_svc.service.rpc.generate (grpcio-tools {tools_version()}): "
              "version gates removed, relative import.\n")
    stem = name.split("_pb2")[0]
    package = next(str(Path(f).parent).replace("/", ".") for f in PROTO_FILES
                   if Path(f).stem == stem)
    if name.endswith("_pb2.py"):
        text = text.replace("from google.protobuf import runtime_version as _runtime_version\n", "")
        text, n = re.subn(r"_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:.*\n)*?\)\n",
                          "", text)
        if n != 1:
            raise RuntimeError("protoc output changed: no protobuf runtime-version gate found")
    elif name.endswith("_pb2_grpc.py"):
        text, n = re.subn(rf"^from {re.escape(package)} import {stem}_pb2 as",
                          f"from . import {stem}_pb2 as", text, flags=re.M)
        if n != 1:
            raise RuntimeError("protoc output changed: messages import not found")
        text, n = re.subn(r"\nGRPC_GENERATED_VERSION = .*?\n    \)\n", "\n", text, flags=re.S)
        if n != 1:
            raise RuntimeError("protoc output changed: grpcio version gate not found")
        text = text.replace("import warnings\n", "")
    return banner + text


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (grpc_tools) and write the post-processed files into `out_dir`."""
    from grpc_tools import protoc
    import grpc_tools
    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    written = []
    for proto_file in PROTO_FILES:
        with tempfile.TemporaryDirectory() as tmp:
            rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}",
                              f"--python_out={tmp}", f"--pyi_out={tmp}",
                              f"--grpc_python_out={tmp}", str(PROTO_ROOT / proto_file)])
            if rc != 0:
                raise RuntimeError(f"protoc failed on {PROTO_ROOT / proto_file} (exit {rc})")
            produced = Path(tmp) / Path(proto_file).parent
            for suffix in SUFFIXES:
                name = Path(proto_file).stem + suffix
                text = (produced / name).read_text(encoding="utf-8")
                target = Path(out_dir) / name
                target.write_text(_post_process(name, text), encoding="utf-8")
                written.append(target)
    return written


def stale_files() -> list[str]:
    """Names of checked-in generated files that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in GENERATED
                if (Path(tmp) / name).read_bytes() != (OUT_DIR / name).read_bytes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenizer_svc.service.rpc.generate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 if the checked-in code is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run python -m "
                  "tokenizer_svc.service.rpc.generate", file=sys.stderr)
            return 1
        print("generated code is up to date")
        return 0
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

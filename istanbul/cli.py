"""`istanbul` — one command, many subcommands; each part of the project registers its own.

A module listed in COMMAND_MODULES has `register(subparsers)`, which adds its subcommands
and sets `func` on each parser to a callable taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .errors import UserFacingError
from shaders.adapters import NoAdapterError

COMMAND_MODULES = [
    "shaders.cli",           # devices, kernels check/bench/list
    "tokenizer_svc.cli_vocab",  # vocab train
    "tokenizer_svc.cli",     # encode, decode
    "tokenizer_svc.cli_serve",  # serve (gRPC tokenizer service), health
    "trainer_svc.cli_jobs",  # prepare, datasets, submit, jobs, status, watch, cancel, trainer
    "trainer_svc.cli_train",  # train, generate, export
    "istanbul.demo",         # demo: everything above, end to end
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="istanbul",
        description="GPU BPE tokenizer service and WGSL training daemon. Every GPU kernel is "
                    "hand-written WGSL, run through wgpu (Vulkan; software Vulkan without a GPU).")
    parser.add_argument("--version", action="version", version=f"istanbul {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (UserFacingError, NoAdapterError) as exc:
        print(f"istanbul {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

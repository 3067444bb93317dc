"""`python -m tokenizer_svc --vocab V --port P`: the gRPC tokenizer service, with the flags of
`istanbul serve` (tokenizer_svc/service/cli.py)."""

import sys


def main(argv=None) -> int:
    from istanbul.shaders.cli import run_device_command
    from .service.cli import add_serve_arguments, cmd_serve
    return run_device_command(
        "python -m tokenizer_svc", "Run the gRPC tokenizer service (the same as `istanbul serve`).",
        add_serve_arguments, cmd_serve, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())

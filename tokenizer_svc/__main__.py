"""`python -m tokenizer_svc --vocab V --port P`: the gRPC tokenizer service, the same as
`istanbul serve` (the same flags, checks and errors)."""

import sys


def main(argv=None) -> int:
    from istanbul.cli import main as istanbul_main
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in argv if a in ("-v", "--verbose")]     # istanbul's own option
    return istanbul_main([*verbose, "serve", *(a for a in argv if a not in verbose)])


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m trainer_svc`: the training daemon (the same as `istanbul trainer`)."""

import sys


def main(argv=None) -> int:
    from istanbul.cli import main as istanbul_main   # the same flags, checks and errors
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in argv if a in ("-v", "--verbose")]     # istanbul's own option
    return istanbul_main([*verbose, "trainer", *(a for a in argv if a not in verbose)])


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m trainer_svc`: the training daemon (the same as `istanbul trainer`)."""

import argparse
import logging
import sys

from istanbul_errors import UserFacingError
from shaders.adapters import NoAdapterError

from .cli_jobs import add_trainer_args, run_trainer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_svc",
                                     description="istanbul training daemon: takes jobs from "
                                                 "Redis and trains them on the GPU")
    add_trainer_args(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run_trainer(args)
    except (UserFacingError, NoAdapterError) as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

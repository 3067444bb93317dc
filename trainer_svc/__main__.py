"""`python -m trainer_svc --checkpoints DIR`: the training daemon, with the flags of
`istanbul trainer` (trainer_svc/cli_jobs.py)."""

import sys


def main(argv=None) -> int:
    from istanbul.shaders.cli import run_device_command
    from .cli_jobs import add_trainer_args, cmd_trainer
    return run_device_command(
        "python -m trainer_svc", "Run a training daemon (the same as `istanbul trainer`).",
        add_trainer_args, cmd_trainer, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())

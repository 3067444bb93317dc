"""`istanbul` — one command, many subcommands; each part of the project registers its own.

A module listed in COMMAND_MODULES has `register(subparsers)`, which adds its subcommands
and sets `func` on each parser to a callable taking the parsed args and returning an exit code.

What holds for every subcommand lives here, so the parts only declare their flags:
- every `--help` shows each option's default (`DefaultsHelpFormatter`);
- an unknown option is reported under the subcommand's own usage, with a did-you-mean;
- `--require-gpu` (on every command that opens a GPU) refuses software Vulkan before any work.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys

from . import __version__
from .errors import UserFacingError

COMMAND_MODULES = [
    "istanbul.shaders.cli",           # devices, kernels check/bench/list
    "tokenizer_svc.cli_vocab",  # vocab train, vocab fetch
    "tokenizer_svc.cli",     # encode, decode
    "tokenizer_svc.service.cli",  # serve (gRPC tokenizer service), health
    "trainer_svc.cli_jobs",  # prepare, datasets, submit, jobs, status, watch, cancel, trainer
    "trainer_svc.cli_train",  # train, generate, export
    "trainer_svc.cli_tune",  # kernels tune (the tuner at a model preset's shapes)
    "istanbul.dashboard.cli",  # dashboard (web page of the queue, jobs, daemons)
    "istanbul.demo",         # demo: everything above, end to end
]

class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends '(default: X)' to an option's help unless the text already states its default
    or there is nothing to state (no default, a switch that is off, a list that is empty)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or not has_default_to_show(action):
            return text
        return f"{text} (default: %(default)s)"


def has_default_to_show(action: argparse.Action) -> bool:
    default = action.default
    return bool(action.option_strings) and not (
        default is None or default is False or default is argparse.SUPPRESS or default == []
        or isinstance(action, (argparse._HelpAction, argparse._VersionAction)))


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def walk_parsers(parser: argparse.ArgumentParser):
    """The parser and every subcommand parser below it (each once)."""
    yield parser
    for action in _subparsers(parser):
        seen = set()
        for sub in action.choices.values():
            if id(sub) not in seen:
                seen.add(id(sub))
                yield from walk_parsers(sub)


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
    for p in walk_parsers(parser):
        p.formatter_class = DefaultsHelpFormatter
        for action in p._actions:     # an option without help text still shows its default
            if action.help is None and has_default_to_show(action):
                action.help = "(default: %(default)s)"
    return parser


def _command_path(parser, args) -> list[argparse.ArgumentParser]:
    """The chain of parsers the arguments selected: [istanbul, train] or [istanbul, kernels,
    check]."""
    chain = [parser]
    while True:
        actions = list(_subparsers(chain[-1]))
        if not actions:
            return chain
        chosen = getattr(args, actions[0].dest, None)
        if chosen is None or chosen not in actions[0].choices:
            return chain
        chain.append(actions[0].choices[chosen])


def _option_strings(parser) -> list[str]:
    return [s for a in parser._actions if a.help is not argparse.SUPPRESS
            for s in a.option_strings if s.startswith("--")]


def _target_parser(parser: argparse.ArgumentParser, argv: list[str]):
    """The subcommand parser `argv` selects, found before parsing (so that a misspelt option
    is reported before a missing required one)."""
    target = parser
    for arg in argv:
        if arg.startswith("-"):
            continue
        actions = list(_subparsers(target))
        if not actions or arg not in actions[0].choices:
            break
        target = actions[0].choices[arg]
    return target


def _unknown_options(parser, target, argv: list[str]) -> list[str]:
    known = _option_strings(target) + _option_strings(parser)
    unknown = []
    for arg in argv:
        if arg == "--":
            break
        name = arg.partition("=")[0]
        if " " in name:              # argparse takes it as a value ("--prompt '--x y'")
            continue
        if arg.startswith("--") and not any(k.startswith(name) for k in known):
            unknown.append(name)     # (a unique prefix is argparse's abbreviation: fine)
    return unknown


def _refuse_unknown(target, unknown: list[str]) -> None:
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag, _option_strings(target), n=1, cutoff=0.6)
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    target.error(f"unrecognized arguments: {' '.join(unknown)}"
                 + (f" ({'; '.join(hints)})" if hints else ""))


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None):
    """parse_args, but unknown options fail under the subcommand's usage with a suggestion."""
    argv = list(sys.argv[1:] if argv is None else argv)
    target = _target_parser(parser, argv)
    unknown = _unknown_options(parser, target, argv)
    if unknown:
        _refuse_unknown(target, unknown)
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_unknown(_command_path(parser, args)[-1], extra)
    return args


def main(argv: list[str] | None = None) -> int:
    from istanbul.shaders.adapters import NoAdapterError
    from istanbul.shaders.cli import check_required_gpu
    parser = build_parser()
    args = parse_args(parser, argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        check_required_gpu(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (UserFacingError, NoAdapterError) as exc:
        print(f"istanbul {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

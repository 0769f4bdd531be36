"""The ``ddptop`` command: argument parsing, dispatch, and the one error-to-exit mapping.

Each verb lives in its own module (``ddptop.cli.<verb>``) exposing ``configure(parser)``
and ``run(args) -> int``. Errors of the :class:`DdptopError` hierarchy become one line
on stderr and their exit code; nothing a user can cause prints a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from ddptop._version import __version__
from ddptop.errors import DdptopError, UsageError, exit_code_for

# verb -> (module, one-line help). Public interface: add verbs, never rename.
VERBS: dict[str, tuple[str, str]] = {
    "launch": ("ddptop.cli.launch", "run a command (torchrun ...) with the reporter in every rank"),
    "attach": ("ddptop.cli.attach", "live dashboard of a running job"),
    "snapshot": ("ddptop.cli.snapshot", "print every rank's state once (table or --json)"),
    "doctor": ("ddptop.cli.doctor", "diagnose a job or a bundle; exit 1 if something is wrong"),
    "export": ("ddptop.cli.export", "write a diagnosis bundle of a live job"),
    "record": ("ddptop.cli.record", "record a live job into a file until it ends"),
    "replay": ("ddptop.cli.replay", "open a recording or bundle in the dashboard"),
    "jobs": ("ddptop.cli.jobs", "list ddptop jobs on this host"),
    "demo": ("ddptop.cli.demo", "start a 4-rank CPU job with a planted fault and attach"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own errors are usage errors: one line, exit 2.
        self.exit(2, f"ddptop: error: {message} (see `{self.prog} --help`)\n")


def _load(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None  # verb not built yet in this checkout
        raise


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: a subparser per verb, the arguments of *verb* only (None: of every
    verb). Each verb's module is imported only to configure it: a `ddptop snapshot` loads no
    dashboard, launcher or agent code (a viewer polled every second pays for its imports)."""
    parser = _Parser(prog="ddptop", description="top for torchrun jobs")
    parser.add_argument("--version", action="version", version=f"ddptop {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, (module_name, help_text) in VERBS.items():
        if verb is not None and name != verb:
            sub.add_parser(name, help=help_text, description=help_text)  # listed, never parsed
            continue
        module = _load(module_name)
        if module is None:
            continue
        verb_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(verb_parser)
        verb_parser.set_defaults(_run=module.run)
    return parser


def chosen_verb(argv: Sequence[str]) -> str | None:
    """The verb *argv* names (its first word that is not an option), if it is one of ours:
    the global options take no value, so the first such word is the verb."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in VERBS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ddptop`` console script."""
    words = list(sys.argv[1:] if argv is None else argv)
    verb = chosen_verb(words)
    # Without a verb of ours (`ddptop`, `ddptop --help`, a typo) no verb is loaded: argparse
    # lists them, or says which word it does not know.
    parser = build_parser(verb if verb is not None else "")
    args = parser.parse_args(words)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="ddptop: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return UsageError.exit_code
    try:
        return int(args._run(args))
    except DdptopError as exc:
        print(f"ddptop: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        return exit_code_for(KeyboardInterrupt())
    except BrokenPipeError:
        return 0  # `ddptop snapshot | head`


if __name__ == "__main__":
    sys.exit(main())

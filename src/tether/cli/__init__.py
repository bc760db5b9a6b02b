"""The ``tether`` command line, one module per noun (runs, waits, cells, sessions, tools, sources, serve, demo).

Exit codes: 0 completed, 1 failed (or cancelled), 2 bad usage, 3 paused or
waiting (the run continues later), 4 `runs await` timed out.
Every command that prints a result takes ``--json`` for scripts.

:func:`main` returns the exit code and never leaves the process itself, so it
can run inside another program (the tests call it in process); the console
script and ``python -m tether.cli`` turn its code into the process's exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Sequence

from tether.cli import cells, demo, runs, serve, sessions, sources, store, tools, waits
from tether.cli._common import EXIT_FAILED, EXIT_OK, EXIT_PAUSED, EXIT_TIMED_OUT, EXIT_USAGE, print_json
from tether.errors import TetherError, UsageError

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_PAUSED", "EXIT_TIMED_OUT", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether", description="Run model-written Python against tools, durably.")
    p.add_argument("--config", help="path to tether.toml (default: $TETHER_CONFIG, else ./tether.toml if present)")
    sub = p.add_subparsers(dest="command", required=True)
    # The order `tether --help` lists them in.
    runs.add_run(sub)
    runs.add_resume(sub)
    runs.add_runs(sub)
    runs.add_start(sub)
    runs.add_worker(sub)
    waits.add_waits(sub)
    cells.add_cells(sub)
    sessions.add_sessions(sub)
    runs.add_recover(sub)
    store.add_store(sub)
    tools.add_tools(sub)
    sources.add_sources(sub)
    demo.add_demo(sub)
    tools.add_prompt(sub)
    serve.add_serve(sub)
    _config_everywhere(p)
    return p


_CONFIG_HELP = "path to tether.toml (default: $TETHER_CONFIG, else ./tether.toml if present)"


def _config_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--config`` after the subcommand too (`tether run --config X prog.py`), as people type it.

    SUPPRESS keeps a subcommand that was not given it from overwriting one given before the subcommand.
    """
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk of subparsers
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for child in dict.fromkeys(action.choices.values()):
                _config_everywhere(child)
            return
    if parser.prog != "tether" and not any("--config" in a.option_strings for a in parser._actions):  # noqa: SLF001
        parser.add_argument("--config", default=argparse.SUPPRESS, help=_CONFIG_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or bad usage (argparse has printed why)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return asyncio.run(args.func(args))
    except TetherError as exc:
        if getattr(args, "json", False):
            print_json({"status": "error", "error": exc.to_dict()})
        else:
            print(f"error: {exc}", file=sys.stderr)
            print(f"next: {exc.next_action}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`tether runs list | head`): what it wanted was
        # printed. Point stdout at devnull so the final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK

"""Helpers for CLI commands that act on a wait key (kept out of cli.py for size)."""

from __future__ import annotations

import argparse

from .config import load_config
from .store import open_store


def recorded_setup_for_key(args: argparse.Namespace) -> tuple[list[str], str | None, list[dict] | None]:
    """The tools and config of the run a key belongs to, so the run can continue here."""
    from .runs.waits import parse_wait_key

    config = load_config(args.config)
    store = open_store(config.store.url)
    try:
        parsed = parse_wait_key(store.secret(), args.key)
        run = store.get_run(parsed[0]) if parsed else None
    finally:
        store.close()
    from .cli import recorded_setup

    return recorded_setup(args, run)

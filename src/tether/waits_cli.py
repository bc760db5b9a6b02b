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
        meta = trusted_meta(store, run)
    finally:
        store.close()
    from .cli import recorded_setup

    return recorded_setup(args, meta)


def trusted_meta(store, run, *, lenient: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """A run's recorded setup (tools, config) once its signature verifies, else nothing (P-35).

    What a run recorded names modules to import and a config to load, so it is
    used only when signed: a tampered run gets no setup here and the runtime
    then ends it ``run_tampered``. A run signed with another secret raises
    ``WrongSecret``, unless ``lenient`` (cancelling needs no setup).
    """
    from .errors import RunTampered, WrongSecret
    from .runs.integrity import keyring_for, verify_run
    from .store.states import TERMINAL_RUN_STATUSES

    if run is None or run.status in TERMINAL_RUN_STATUSES:
        return {}
    try:
        verify_run(keyring_for(store), run)
    except RunTampered:
        return {}
    except WrongSecret:
        if lenient:
            return {}
        raise
    return run.meta or {}

"""`tether waits ...`: list pending waits, resolve one by its key, revoke a run's or a session's."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tether.cli._common import (
    EXIT_OK,
    add_acting_as,
    add_common,
    json_arg,
    open_rt,
    owned_elsewhere,
    print_json,
    print_wait_outcome,
    recorded_setup,
    trusted_meta,
)
from tether.errors import InvalidArguments, RunNotFound


async def cmd_waits_list(args: argparse.Namespace) -> int:
    from tether._config import load_config
    from tether._runtime import Runtime
    from tether._store import open_store

    store = open_store(load_config(args.config).store.url)
    try:
        rt = Runtime(store=store, type_check=False)
        try:
            waits = rt.list_waits(args.run, principal=args.acting_as)
        except RunNotFound as exc:
            raise owned_elsewhere(store, args.run, args.acting_as, exc, undone="nothing was listed",
                                  example=f"tether waits list --run {args.run}") from None
    finally:
        store.close()
    if args.json:
        print_json(waits)
        return EXIT_OK
    if not waits:
        print("no pending waits")
    for w in waits:
        # The date too: an approval's wait times out a day later, at what reads as the time it was made.
        due = "" if w["deadline"] is None else f" (times out {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(w['deadline']))})"
        print(f"{w['run_id']}  {w['name']:<20} {w['key']}{due}")
    return EXIT_OK


async def cmd_waits_resolve(args: argparse.Namespace) -> int:
    value = None if args.error is not None else json_arg(args.value)
    tools, config, sources = recorded_setup_for_key(args)
    args.config = config
    async with open_rt(args, tools, sources=sources) as rt:
        out = await rt.resolve_wait(args.key, value, error=args.error)
    return print_wait_outcome(out, args.json)


async def cmd_waits_revoke(args: argparse.Namespace) -> int:
    if not (args.run or args.session):
        raise InvalidArguments("say whose waits to revoke: --run RUN_ID or --session NAME")
    async with open_rt(args, []) as rt:
        n = rt.engine.waits.revoke(run_id=args.run, session=args.session)
    if args.json:
        print_json({"revoked": n})
    else:
        print(f"revoked {n} waits")
    return EXIT_OK


def recorded_setup_for_key(args: argparse.Namespace) -> tuple[list[str], str | None, list[dict] | None]:
    """The tools and config of the run a key belongs to, so the run can continue here."""
    from tether._config import load_config
    from tether._engine.approvals.capabilities import keyring_for
    from tether._engine.waits import parse_wait_key
    from tether._store import open_store

    config = load_config(args.config)
    store = open_store(config.store.url)
    try:
        parsed = parse_wait_key(keyring_for(store).keys, args.key)
        run = store.get_run(parsed[0]) if parsed else None
        meta = trusted_meta(store, run)
    finally:
        store.close()
    return recorded_setup(args, meta)


def add_waits(sub: Any) -> None:
    waits = sub.add_parser("waits", help="durable waits").add_subparsers(dest="waits_command", required=True)
    sp = waits.add_parser("list", help="pending waits with their keys")
    sp.add_argument("--run", metavar="RUN_ID", help="only this run's waits")
    add_acting_as(sp)
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_waits_list)
    sp = waits.add_parser("resolve", help="resolve a wait by its key; the first resolution wins")
    sp.add_argument("key")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--value", help="a JSON value")
    g.add_argument("--error", help="fail the wait with this message")
    add_common(sp)
    sp.set_defaults(func=cmd_waits_resolve)
    sp = waits.add_parser("revoke", help="revoke every pending wait of a run or a session")
    sp.add_argument("--run", metavar="RUN_ID", help="the run whose waits to revoke")
    sp.add_argument("--session", help="the REPL session whose waits to revoke")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_waits_revoke)

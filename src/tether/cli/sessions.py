"""`tether sessions ...`: a REPL session's stored state."""

from __future__ import annotations

import argparse
from typing import Any

from tether.cli._common import EXIT_OK, add_common, open_rt, print_json


async def cmd_sessions_reset(args: argparse.Namespace) -> int:
    async with open_rt(args, []) as rt:
        existed = rt.reset_session(args.name)
    if args.json:
        print_json({"session": args.name, "reset": existed})
    else:
        print(f"session {args.name}: " + ("reset" if existed else "no stored state (its waits, if any, are revoked)"))
    return EXIT_OK


def add_sessions(sub: Any) -> None:
    sessions = sub.add_parser("sessions", help="REPL sessions").add_subparsers(dest="sessions_command", required=True)
    sp = sessions.add_parser("reset", help="forget a session's globals and revoke its waits")
    sp.add_argument("name")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_sessions_reset)

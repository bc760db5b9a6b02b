"""`tether demo`: the built-in help desk, run as an agent would."""

from __future__ import annotations

import argparse
from typing import Any

from tether._store.states import RunStatus
from tether.cli._common import EXIT_OK, add_common, exit_code, open_rt, print_json, print_result


async def cmd_demo(args: argparse.Namespace) -> int:
    from tether.demo import DEMO_PROGRAM

    if not args.json:  # --json prints the envelope alone, so a script can parse what it reads
        print("tether demo: a help desk with customers, tickets and comments.\n")
        print("The program an agent would send:\n")
        for line in DEMO_PROGRAM.strip().splitlines():
            print(f"    {line}")
        print()
    async with open_rt(args, ["tether.demo.helpdesk"]) as rt:
        result = await rt.execute(DEMO_PROGRAM, meta={"tools": ["tether.demo.helpdesk"]})
    if args.json:
        print_json(result.to_dict())
        return exit_code(result.status)
    if result.status == RunStatus.COMPLETED and isinstance(result.result, dict) and "by_priority" in result.result:
        _print_demo_summary(result.result)
        code = EXIT_OK
    else:
        code = print_result(result, False)
    d = result.diagnostics
    print(f"\n{result.calls} host calls in {d.get('total_ms', 0):.1f} ms (run {result.run_id}; "
          f"see: {_tether_command()} runs show {result.run_id})")
    return code


def _tether_command() -> str:
    """How to call tether again from a new shell: `tether` if the PATH finds this one, else its own path.

    After `make run`, tether lives in .venv/bin, which a new shell's PATH does not hold.
    """
    import os
    import shutil
    import sys

    me = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "tether" else None
    if me is None:
        return "tether"
    found = shutil.which("tether")
    if found is not None and os.path.realpath(found) == os.path.realpath(me):
        return "tether"
    return os.path.relpath(me) if not os.path.relpath(me).startswith("..") else os.path.abspath(me)


def _print_demo_summary(r: dict) -> None:
    print("The program's result, for people:\n")
    print(f"  tools it found:     {', '.join(r.get('tools_found') or [])}")
    prio = ", ".join(f"{k} {v}" for k, v in sorted(r["by_priority"].items(), key=lambda kv: -kv[1]))
    print(f"  open tickets:       {r.get('open_tickets')} ({prio})")
    busiest = ", ".join(f"{b['customer']} ({b['open']})" for b in r.get("busiest_customers") or [])
    print(f"  busiest customers:  {busiest}")
    print("  oldest open tickets:")
    for t in r.get("oldest_open") or []:
        who = t.get("assignee") or "unassigned"
        print(f"    {t['id']}  {t['opened']}  {t['priority']:<7} {t['title'][:40]:<40}  {t['customer']} · {who}")


def add_demo(sub: Any) -> None:
    sp = sub.add_parser("demo", help="run the built-in help desk demo")
    add_common(sp, tools=False)
    sp.add_argument("--no-check", action="store_true", help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_demo)

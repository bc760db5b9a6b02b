"""`tether cells ...`: start a cell on the worker, wait on it, watch it live, terminate it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tether._tools.shown import escape
from tether.cli._common import EXIT_FAILED, EXIT_OK, add_common, ensure_worker, open_rt, read_program, run_setup


def _print_obs(obs: dict[str, Any], as_json: bool) -> int:
    if as_json:
        sys.stdout.write(json.dumps(obs, indent=2, ensure_ascii=False) + "\n")
    else:
        for e in obs["events"]:
            line = format_event(e)
            if line:
                print(escape(line, keep_lines=True))
        print(f"[{obs['status']}] cell {obs['cell_id']} cursor {obs['cursor']}")
    return EXIT_FAILED if obs["status"] in ("failed", "terminated") else EXIT_OK


def format_event(e: dict[str, Any]) -> str | None:
    t = e["type"]
    if t == "output":
        v = e.get("value")
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    if t == "completed":
        return "result: " + json.dumps(e.get("result"), ensure_ascii=False)
    if t in ("failed", "terminated"):
        err = e.get("error") or {}
        return f"{t}: [{err.get('code')}] {err.get('message')}"
    if t in ("paused", "waiting"):
        p = e.get("pending") or {}
        return f"{t}: waits on {p.get('address') or p.get('name')} (call {p.get('seq')})"
    return None


def progress_bar(value: Any, width: int = 30) -> str | None:
    """A bar for emit({"progress": done, "total": n}); None for other outputs."""
    if not (isinstance(value, dict) and isinstance(value.get("progress"), (int, float))
            and isinstance(value.get("total"), (int, float)) and value["total"] > 0):
        return None
    frac = max(0.0, min(1.0, value["progress"] / value["total"]))
    filled = int(frac * width)
    label = f" {value.get('label')}" if value.get("label") else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {value['progress']}/{value['total']}{label}"


async def cmd_cells_start(args: argparse.Namespace) -> int:
    from tether._app import resolve_tool_spec
    from tether._engine.cells import observation, wait_events

    code = read_program(args.program)
    tools = [resolve_tool_spec(t) for t in args.tools]
    async with open_rt(args, tools) as rt:
        cell_id = rt.start(code, meta={"tools": tools, "cell": True})
        ensure_worker(args, tools)
        events = await wait_events(rt.engine, cell_id, 0, args.yield_after_ms)
        return _print_obs(observation(rt.engine, cell_id, events, 0), args.json)


async def cmd_cells_wait(args: argparse.Namespace) -> int:
    async with open_rt(args, []) as rt:
        obs = await rt.wait_cell(args.cell_id, after=args.after, timeout_ms=args.timeout_ms)
    return _print_obs(obs, args.json)


async def cmd_cells_watch(args: argparse.Namespace) -> int:
    """Follow a cell until it stops: outputs as lines, progress as one redrawn bar."""
    tty = sys.stdout.isatty()
    async with open_rt(args, []) as rt:
        cursor, bar_shown = args.after, False
        while True:
            obs = await rt.wait_cell(args.cell_id, after=cursor, timeout_ms=30_000)
            for e in obs["events"]:
                bar = progress_bar(e.get("value")) if e["type"] == "output" else None
                if bar is not None:
                    if tty:
                        sys.stdout.write("\r" + bar)
                        sys.stdout.flush()
                        bar_shown = True
                    else:
                        print(bar)
                    continue
                line = format_event(e)
                if line:
                    if bar_shown:
                        sys.stdout.write("\n")
                        bar_shown = False
                    print(escape(line, keep_lines=True))
            cursor = obs["cursor"]
            if obs["status"] != "running":
                if bar_shown:
                    sys.stdout.write("\n")
                print(f"[{obs['status']}] cell {obs['cell_id']}")
                return EXIT_FAILED if obs["status"] in ("failed", "terminated") else EXIT_OK


async def cmd_cells_terminate(args: argparse.Namespace) -> int:
    args.run_id = args.cell_id
    tools, config, sources = run_setup(args)
    args.config = config
    async with open_rt(args, tools, sources=sources) as rt:
        obs = await rt.terminate_cell(args.cell_id)
    _print_obs(obs, args.json)
    return EXIT_OK


def add_cells(sub: Any) -> None:
    cells = sub.add_parser("cells", help="observe programs while they run").add_subparsers(
        dest="cells_command", required=True)
    sp = cells.add_parser("start", help="start a program on the worker and print its first observation")
    sp.add_argument("program", help="path to a .py file, or - for standard input")
    sp.add_argument("--yield-after-ms", type=int, default=1000, help="observe it this long before printing (default 1000)")
    add_common(sp)
    sp.set_defaults(func=cmd_cells_start)
    sp = cells.add_parser("wait", help="long-poll a cell's events after a cursor")
    sp.add_argument("cell_id")
    sp.add_argument("--after", type=int, default=0, metavar="CURSOR", help="events after this cursor (default 0: all)")
    sp.add_argument("--timeout-ms", type=int, default=30_000, help="return after this long with what came (default 30000)")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_cells_wait)
    sp = cells.add_parser("watch", help="follow a cell live until it stops")
    sp.add_argument("cell_id")
    sp.add_argument("--after", type=int, default=0, metavar="CURSOR", help="events after this cursor (default 0: all)")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_cells_watch)
    sp = cells.add_parser("terminate", help="stop a cell; nothing further is sent")
    sp.add_argument("cell_id")
    add_common(sp)
    sp.set_defaults(func=cmd_cells_terminate)

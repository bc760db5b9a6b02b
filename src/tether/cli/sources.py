"""`tether sources ...`: the configured tool sources, their tools and what went wrong."""

from __future__ import annotations

import argparse
from typing import Any

from tether.cli._common import EXIT_FAILED, EXIT_OK, add_common, open_rt, print_json, show


async def cmd_sources_list(args: argparse.Namespace) -> int:
    async with open_rt(args, list(args.tools)) as rt:
        sources = rt.engine.sources
        assert sources is not None  # open_runtime always sets a runtime's sources up
        if getattr(args, "refresh", False):
            await sources.refresh()
        statuses = [s.status() for s in sources.statuses()]
        namespaces = rt.engine.list_sources()
    all_ok = all(s["ok"] for s in statuses)
    if args.json:
        print_json({"sources": statuses, "namespaces": namespaces})
        return EXIT_OK if all_ok else EXIT_FAILED
    for s in statuses:
        state = f"{s['tools']} tools" if s["ok"] else f"FAILED: {s['error']}"
        show(f"{s['source']:<24} {s['type']:<8} {state}")
        if s.get("origin"):
            show(f"    from {s['origin']}")
        for p in s["problems"]:
            show(f"    skipped {p.get('operation')}: {p.get('problem')}")
    if not statuses:
        show("no sources configured (add [[sources]] to tether.toml or pass --tools)")
    # The same lines a program gets from sources() and the prompt names.
    if namespaces:
        show("namespaces:")
    for ns in namespaces:
        what = ns.get("summary") or (f"unavailable: {ns['error']}" if ns.get("error") else "")
        show(f"  {ns['namespace']} ({ns['tools']} tools): {what}")
    return EXIT_OK if all(s["ok"] for s in statuses) else EXIT_FAILED


def add_sources(sub: Any) -> None:
    sources = sub.add_parser("sources", help="configured tool sources").add_subparsers(dest="sources_command", required=True)
    sp = sources.add_parser("list", help="each source: tools, skipped operations, errors")
    add_common(sp)
    sp.set_defaults(func=cmd_sources_list, refresh=False)
    sp = sources.add_parser("refresh", help="start every MCP server and update its cached tool listing")
    add_common(sp)
    sp.set_defaults(func=cmd_sources_list, refresh=True)

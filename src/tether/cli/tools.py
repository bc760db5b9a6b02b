"""`tether tools ...` and `tether prompt`: the tools a program finds, and how it is told about them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tether.cli._common import EXIT_FAILED, EXIT_OK, add_common, open_rt, print_json, show


async def cmd_tools_search(args: argparse.Namespace) -> int:
    async with open_rt(args, list(args.tools)) as rt:
        found = rt.search(args.query, namespace=args.namespace, limit=args.limit, offset=args.offset)
    if args.json:
        print_json(found)
        return EXIT_OK
    for item in found["results"]:
        ro = "read " if item["annotations"]["read_only"] else "write"
        show(f"{item['address']:<36} {ro}  {(item.get('description') or '').splitlines()[0][:70] if item.get('description') else ''}")
    if found.get("next_offset") is not None:
        show(f"... more: --offset {found['next_offset']}")
    return EXIT_OK


async def cmd_tools_describe(args: argparse.Namespace) -> int:
    async with open_rt(args, list(args.tools)) as rt:
        # --full on a terminal has no result limit to stay under: everything, whatever its size.
        described = rt.describe(list(args.address), detail="full" if args.full else "default", whole=args.full)
    if args.json:
        print_json(described)
        return EXIT_OK
    status = EXIT_OK
    for d in described:
        if d.get("error"):
            status = EXIT_FAILED
            show(f"{d['address']}: unknown tool; did you mean: {', '.join(d.get('suggestions') or []) or '-'}")
            continue
        show(d["signature"])
        if d.get("parameters"):
            show(f"    # parameters {d['parameters']}")
        if d.get("description"):
            show(f'    """{d["description"]}"""')
        if d.get("types"):
            show()
            show(d["types"])
        if d.get("input_schema") is not None and args.full:
            show()
            show("# input_schema")
            show(json.dumps(d["input_schema"], indent=2, ensure_ascii=False))
        if d.get("note"):
            show(f"# {d['note']}")
        show()
    return status


async def cmd_prompt(args: argparse.Namespace) -> int:
    async with open_rt(args, list(args.tools)) as rt:
        text = rt.engine.model_description()
    if args.json:
        print_json({"prompt": text, "bytes": len(text.encode())})
    else:
        print(text)
    return EXIT_OK


def add_tools(sub: Any) -> None:
    tools = sub.add_parser("tools", help="search and describe tools").add_subparsers(dest="tools_command", required=True)
    sp = tools.add_parser("search", help="tools ranked for a query, as search() in a program")
    sp.add_argument("query", nargs="?", default="", help="words; none lists tools alphabetically")
    sp.add_argument("--namespace", help="search only this namespace")
    sp.add_argument("--limit", type=int, default=12, help="results per page, 1..100 (default 12)")
    sp.add_argument("--offset", type=int, default=0, help="where the page starts (the previous page's next offset)")
    add_common(sp)
    sp.set_defaults(func=cmd_tools_search)
    sp = tools.add_parser("describe", help="tools' signatures and shapes, as describe() in a program")
    sp.add_argument("address", nargs="+", help="namespace.tool")
    sp.add_argument("--full", action="store_true", help="every shape and the whole description (default: at most 2 KB a tool)")
    add_common(sp)
    sp.set_defaults(func=cmd_tools_describe)


def add_prompt(sub: Any) -> None:
    sp = sub.add_parser("prompt", help="print the model-facing description of the sandbox API")
    add_common(sp)
    sp.set_defaults(func=cmd_prompt)

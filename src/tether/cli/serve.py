"""`tether serve`: tether as an MCP server."""

from __future__ import annotations

import argparse
from typing import Any

from tether.cli._common import add_common


async def cmd_serve(args: argparse.Namespace) -> int:
    from tether._server.start import ServeOptions, serve

    return await serve(ServeOptions(config_path=args.config, tools=tuple(args.tools), http=args.http, dev=args.dev))


def add_serve(sub: Any) -> None:
    sp = sub.add_parser("serve", help="serve tether over MCP")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--stdio", action="store_true", help="MCP over standard input/output")
    g.add_argument("--http", metavar="HOST:PORT", help="MCP over streamable HTTP")
    sp.add_argument("--dev", action="store_true", help="allow HTTP without a token on a loopback address")
    add_common(sp)
    sp.set_defaults(func=cmd_serve)

"""An MCP server's "open this link first" error as the program reads it (D-89).

A server answers a tool call with error -32042 (URL elicitation required) when
the user must finish something in a browser (sign in, consent, pay) before the
call can go ahead. The call was refused, so nothing was done; the links are for
the person, and the program is the one that can hand them on. Pure: the error's
``data`` is the upstream's, read defensively.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tether._tools.shown import escape

# Enough for the flows a server asks for at once (sign-in, then consent); a
# server listing hundreds cannot flood the program's context.
MAX_LINKS = 3
# A link longer than this is not one a person is meant to open.
MAX_URL_CHARS = 2000
MAX_MESSAGE_CHARS = 300


def url_required(address: str, data: Any, rpc_message: str) -> tuple[str, list[dict[str, str]]]:
    """``(message, links)`` for a -32042 answer to a call of ``address``; ``links`` holds only http(s) URLs."""
    raw = data.get("elicitations") if isinstance(data, dict) else None
    links: list[dict[str, str]] = []
    for item in raw if isinstance(raw, list) else []:
        if len(links) == MAX_LINKS:
            break
        link = _link(item)
        if link is not None:
            links.append(link)
    if not links:
        return (f"{address}: the MCP server refused the call until the user completes a step in a browser, "
                f"but sent no link tether can show ({_one_line(rpc_message)}); nothing was done", [])
    asks = "; ".join(f"{link['message']} {link['url']}" if link["message"] else link["url"] for link in links)
    return (f"{address}: the MCP server refused the call until the user opens "
            f"{'this link' if len(links) == 1 else 'these links'}: {asks}. Nothing was done; once the user has "
            "finished there, call the tool again", links)


def link_for_a_person(url: Any) -> bool:
    """Whether ``url`` is a link tether hands a person: http(s), a host, printable ASCII only (D-91).

    A URI is ASCII (RFC 3986; a server percent-encodes the rest): a bidi override or zero-width character would
    make it read as another link, and a look-alike letter (a Cyrillic "е") another host.
    """
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS or not all(" " < c < "\x7f" for c in url):
        return False
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    # javascript:, data:, file: ... are not links to hand a person.
    return parts.scheme in ("https", "http") and bool(host)


def _link(item: Any) -> dict[str, str] | None:
    if not isinstance(item, dict):
        return None
    url = item.get("url")
    if not isinstance(url, str) or not link_for_a_person(url):
        return None
    message = item.get("message")
    link = {"url": url, "message": _one_line(message) if isinstance(message, str) else ""}
    if isinstance(item.get("elicitationId"), str):
        link["elicitation_id"] = escape(item["elicitationId"][:200])
    return link


def _one_line(text: str) -> str:
    # Terminal escapes and bidi overrides are the server's text, not an effect on the person's view (D-91).
    text = escape(" ".join(text.split()))
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"

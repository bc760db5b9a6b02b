"""Turning upstream names (MCP tools, OpenAPI operations and parameters) into Python identifiers."""

from __future__ import annotations

import keyword
import re


def identifier(text: str, fallback: str) -> str:
    """A valid, non-keyword identifier for ``text``: other characters become ``_``."""
    ident = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_") or fallback
    if ident[0].isdigit():
        ident = f"{fallback}_{ident}"
    if keyword.iskeyword(ident) or keyword.issoftkeyword(ident):
        ident += "_"
    return ident


def unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``... whichever is not taken yet."""
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    return candidate

"""How the console's pages are drawn: the Jinja2 environment and the filters its templates use.

Pure functions of the value shown, kept apart from the handlers: every text a page shows passes
through ``_shown`` (``finalize``), whichever page draws it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from tether._tools.shown import escape as escape_controls
from tether._tools.shown import redacted

# The templates and static files stay beside the server's modules (package data, pyproject.toml).
HERE = Path(__file__).parent.parent


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _short(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= 20 else text[:18] + "…"


def _short_name(text: str | None) -> str:
    # A principal's kind and name (D-62): room for both.
    text = text or ""
    return text if len(text) <= 44 else text[:42] + "…"


def _compact(value: Any) -> str:
    # Every call's arguments are shown with their secrets replaced (_tools/shown.py's one rule).
    text = json.dumps(redacted(value), ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:300] + "…"


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


def _shown(value: Any) -> Any:
    # Every text a page shows (arguments, logs, results, reasons, errors): control and
    # format characters as escapes, so a bidi override cannot make it read as something else.
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape_controls(value, keep_lines=True)
    return value


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=select_autoescape(default=True),
                      trim_blocks=False, lstrip_blocks=False, finalize=_shown)
    env.filters.update(when=_when, short=_short, compact=_compact, pretty=_pretty, short_name=_short_name)
    return env

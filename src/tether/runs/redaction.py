"""Write arguments that look like secrets, hidden where people read a pause (text, CLI, approval pages).

A write asks a person to approve it, so its arguments are shown; a password
or token among them should not be (issue 22). An argument is secret when the
tool's schema says so (``format: password``, ``writeOnly``) or its name says so
(``password``, ``api_key``, ``client_secret``, ``*_token``…). The journal and
``pending.args`` keep the values: the write is sent with them once approved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tools.model import Tool

__all__ = ["HIDDEN", "is_secret_name", "secret_args", "shown_args"]

HIDDEN = "***"
_WORDS = {"password", "passwd", "passphrase", "secret", "token", "apikey", "credential", "credentials", "pin",
          "otp", "cvv", "cvc", "ssn"}
_PAIRS = {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"), ("client", "secret")}
# Tokens that name a page, not a credential.
_NOT_SECRET = {"page_token", "next_token", "next_page_token", "page_cursor", "continuation_token", "sync_token"}


def is_secret_name(name: str) -> bool:
    """``password``, ``apiKey``, ``x-api-key``, ``client_secret``, ``refresh_token``: yes; ``max_tokens``: no."""
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    if snake in _NOT_SECRET:
        return False
    words = [w for w in re.split(r"[^a-z0-9]+", snake) if w]
    return any(w in _WORDS for w in words) or any(pair in _PAIRS for pair in zip(words, words[1:]))


def secret_args(tool: Tool) -> list[str]:
    """The tool's top-level arguments to hide: by schema (format password, writeOnly) or by name."""
    props = tool.input_schema.get("properties") or {}
    return [name for name, schema in props.items()
            if is_secret_name(name) or (isinstance(schema, dict)
                                        and (schema.get("format") == "password" or schema.get("writeOnly") is True))]


def shown_args(write: Mapping[str, Any]) -> dict[str, Any]:
    """A pending write's arguments as people may see them: secrets (named in ``secret_args`` or by name) hidden."""
    named = set(write.get("secret_args") or ())
    return {k: HIDDEN if k in named or is_secret_name(k) else _nested(v) for k, v in (write.get("args") or {}).items()}


def _nested(value: Any, depth: int = 0) -> Any:
    if depth > 20:
        return value
    if isinstance(value, dict):
        return {k: HIDDEN if isinstance(k, str) and is_secret_name(k) else _nested(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_nested(v, depth + 1) for v in value]
    return value

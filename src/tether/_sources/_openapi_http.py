"""How an OpenAPI call's failures read: HTTP errors with their status, body and Retry-After; secrets hidden."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from tether._sources._openapi_bodies import body_kind
from tether.errors import ToolError

if TYPE_CHECKING:
    import httpx

__all__ = ["ERROR_BODY_LIMIT", "excerpt", "http_error", "redact", "retry_after"]

# Enough of an error body to see what the API objected to, never a whole page.
ERROR_BODY_LIMIT = 1000


def excerpt(text: str) -> str:
    return text[:ERROR_BODY_LIMIT] + "… (truncated)" if len(text) > ERROR_BODY_LIMIT else text


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, round((when - datetime.now(timezone.utc)).total_seconds(), 3))


def http_error(response: httpx.Response, label: str, details: dict[str, Any], secrets: list[str], *,
                in_progress: bool) -> ToolError:
    """A non-2xx answer as the program sees it: status, parsed body and Retry-After, in the message and details.

    A program cannot catch a custom exception class (the sandbox has no
    inheritance), so the message's last line is ``http_error: {json}`` with
    the same ``status``, ``retry_after`` and ``body`` the run's error details carry.
    """
    text = redact(response.text, secrets)
    body: Any = excerpt(text) or None
    if body_kind(response.headers.get("content-type", "")) == "json" and len(text) <= ERROR_BODY_LIMIT * 8:
        try:
            body = json.loads(text)
        except ValueError:
            pass
    if len(json.dumps(body, default=str)) > ERROR_BODY_LIMIT * 2:
        body = excerpt(json.dumps(body))
    retry = retry_after(response.headers.get("retry-after"))
    info: dict[str, Any] = {"code": "http_status", "status": response.status_code, "retry_after": retry, "body": body}
    if in_progress:
        # An earlier send with this key is still being processed
        # (the IETF Idempotency-Key draft's 409): its outcome is not known yet.
        info["outcome"] = "in_progress"
    wait = f"; retry after {retry:g} s" if retry is not None else ""
    carried = json.dumps({"status": response.status_code, "retry_after": retry, "body": body}, ensure_ascii=False)
    return ToolError(
        f"{label} returned HTTP {response.status_code}{wait}{'' if body else ' (empty body)'}\nhttp_error: {carried}",
        details={**details, **info},
    )



def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
            if secret.startswith("Bearer "):
                text = text.replace(secret[len("Bearer ") :], "***")
    return text

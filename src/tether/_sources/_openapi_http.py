"""How an OpenAPI call's failures read: HTTP errors with their status, body and Retry-After; secrets hidden."""

from __future__ import annotations

import http.cookiejar
import json
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tether._sources._openapi_bodies import body_kind
from tether.errors import ToolError

if TYPE_CHECKING:
    import httpx

__all__ = ["ERROR_BODY_LIMIT", "RESPONSE_LIMIT", "cookieless", "excerpt", "http_error", "read_answer", "redact",
           "retry_after", "same_origin"]

# Enough of an error body to see what the API objected to, never a whole page.
ERROR_BODY_LIMIT = 1000
# The most of one answer held in the host: as much as a converted value may hold (README, limits);
# an API (or whatever answers in its place) cannot make the host buffer more.
RESPONSE_LIMIT = 64 << 20


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


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


def cookieless() -> http.cookiejar.CookieJar:
    """A jar that keeps nothing: one source's client serves every run and principal of the
    process, so a cookie kept from one call would be sent with another caller's."""
    return http.cookiejar.CookieJar(policy=_NoCookies())


def same_origin(url: str, base_url: str) -> bool:
    """Whether ``url`` has ``base_url``'s scheme, host and port (RFC 6454), the default port spelled or not."""
    def origin(text: str) -> tuple[str, str, int | None]:
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)

    return origin(url) == origin(base_url)


async def read_answer(client: httpx.AsyncClient, request: httpx.Request) -> tuple[httpx.Response, bool]:
    """The answer to ``request``, its body read up to RESPONSE_LIMIT, and whether the body was read whole.

    The limit counts decoded bytes, so a compressed answer cannot inflate past it;
    an error answer is read only as far as ``http_error`` shows it.
    """
    import httpx

    response = await client.send(request, stream=True)
    limit = RESPONSE_LIMIT if 200 <= response.status_code < 300 else ERROR_BODY_LIMIT * 8
    chunks: list[bytes] = []
    size, whole = 0, True
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                whole = False
                break
    finally:
        await response.aclose()
    # The body is decoded already: the new answer must not claim an encoding or a length it no longer has.
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    # An answer not read whole is refused (a success) or shown cut (an error), never passed on as the API's data.
    body = b"".join(chunks)[:limit]
    return httpx.Response(response.status_code, headers=headers, content=body, request=request), whole

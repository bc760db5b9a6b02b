"""Durable wait keys: signed capabilities naming (run, wait name).

A key is a bearer capability — whoever holds it may resolve the wait — so it
is signed with the store's secret and cannot be derived from the run id. It is
deterministic for a (run, name) pair, so a resolution can arrive, be checked
and be kept before the run reaches the wait.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

KEY_VERSION = "w1"
SIGNAL_PREFIX = "signal:"
SLEEP_PREFIX = "sleep:"
# A paused write is a wait named approval:<seq>; its value is the decision.
APPROVAL_PREFIX = "approval:"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def wait_key(secret: bytes, run_id: str, name: str) -> str:
    payload = _b64(json.dumps([run_id, name], separators=(",", ":"), ensure_ascii=False).encode())
    mac = hmac.new(secret, f"{KEY_VERSION}.{payload}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{KEY_VERSION}.{payload}.{mac}"


def parse_wait_key(secret: bytes, key: str) -> tuple[str, str] | None:
    """(run_id, name) for a genuine key; None for a forged or malformed one."""
    if not isinstance(key, str) or key.count(".") != 2:
        return None
    version, payload, mac = key.split(".")
    if version != KEY_VERSION:
        return None
    expected = hmac.new(secret, f"{version}.{payload}".encode(), hashlib.sha256).hexdigest()[:32]
    if not hmac.compare_digest(expected, mac):
        return None
    try:
        run_id, name = json.loads(_unb64(payload))
    except (ValueError, TypeError):
        return None
    return run_id, name

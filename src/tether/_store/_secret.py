"""The signing secret given outside the store: ``TETHER_SECRET`` or ``TETHER_SECRET_FILE``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tether.errors import StoreError


def _key(raw: str) -> bytes:
    """64 hex digits are the key itself; any other text is hashed to one."""
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    return key if len(key) == 32 else hashlib.sha256(raw.encode()).digest()


def secret_from_env() -> bytes | None:
    """``TETHER_SECRET``, else the first secret of ``TETHER_SECRET_FILE``."""
    found = secrets_from_env()
    return found[0][0] if found else None


def secrets_from_env() -> tuple[list[bytes], str] | None:
    """The secrets given outside the store, current first, and where they came from.

    ``TETHER_SECRET`` is one secret. ``TETHER_SECRET_FILE`` names a file of
    secrets, one a line (``#`` starts a comment): the first signs, the later
    ones only verify, so a rotated store keeps its older runs verifiable.
    Either wins over the secret kept with the store.
    """
    raw = os.environ.get("TETHER_SECRET")
    if raw:
        return [_key(raw)], "env"
    path = os.environ.get("TETHER_SECRET_FILE")
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StoreError(f"cannot read the secret file {path} (TETHER_SECRET_FILE): {reason}",
                         next_action="Point TETHER_SECRET_FILE at a readable file with one secret a line.") from None
    keys = [_key(line.strip()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise StoreError(f"the secret file {path} (TETHER_SECRET_FILE) holds no secret",
                         next_action="Write one secret a line (e.g. 64 hex digits), the current one first.")
    return keys, "file"


__all__ = ["secret_from_env", "secrets_from_env"]

"""Capabilities: every MAC tether makes, from one keyring, one key per purpose.

The store's signing secret reaches tether through :func:`keyring_for` only —
no other module reads ``store.secret()`` — and every HMAC is computed here, so
rotation (sign with the first secret, verify with any held one) is written
once. What each purpose signs, and in which format, stays with its owner; the
formats are the ones tokens and stored MACs were always made in, so whatever
was handed out or stored before keeps verifying (tests/engine/test_rotation.py):

- canonical-JSON MACs named by secret id (:meth:`Keyring.mac`): run fields,
  journal entries, snapshots (_engine/integrity.py), outbox rows (_server/notify.py),
  the MCP listing cache (_sources/loader.py);
- ``<version>.<payload>.<mac>`` tokens (:class:`TokenFormat`): wait keys
  (``w1``, _engine/waits.py), approval links (``a1``, _server/approvals.py),
  console sessions (``s1``) and the sign-in flow cookie (``f1``);
- MACs over a purpose's own bytes (:func:`mac_hex`): sealed MCP request state,
  session globals, keyed digests of literal source secrets, webhook signatures
  (the last under the webhook's own secret, not the store's).

Imports nothing of tether but its errors: the engine, the sources and the
server all sign through it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from functools import cached_property
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, Sequence

from tether.errors import WrongSecret

if TYPE_CHECKING:
    from tether._store.base import Store


def secret_id(secret: bytes) -> str:
    """A short public name for a secret: which key signed a record, without revealing it."""
    return hashlib.sha256(b"tether/secret-id\x00" + secret).hexdigest()[:12]


# An HMAC keyed once per key, copied for each message: keying pads and hashes the key twice, which was
# half of a MAC's cost (2.1 → 0.95 µs for a journal entry's MAC), and every host call and run makes MACs.
# A process holds a handful of keys (its secrets, the keys derived from them per purpose); the bound only
# stops a caller that MACs under many one-off keys from growing this without end.
_KEYED: dict[bytes, hmac.HMAC] = {}
_KEYED_MAX = 64


def mac_hex(key: bytes, message: bytes) -> str:
    """HMAC-SHA256 of ``message`` under ``key``, in hex: the one MAC every capability is made of."""
    keyed = _KEYED.get(key)
    if keyed is None:
        if len(_KEYED) >= _KEYED_MAX:
            _KEYED.clear()
        keyed = _KEYED[key] = hmac.new(key, digestmod=hashlib.sha256)
    h = keyed.copy()
    h.update(message)
    return h.hexdigest()


def same(a: str, b: str) -> bool:
    """Whether two MACs are equal, in time that does not depend on where they differ."""
    return hmac.compare_digest(a, b)


def derive(secret: bytes, purpose: str) -> bytes:
    """One key per purpose from a secret: a link key cannot sign a session, nor the reverse."""
    return hmac.new(secret, f"tether/{purpose}".encode(), hashlib.sha256).digest()


# One encoder for every MAC: json.dumps with options builds a new encoder on each call, which was a third of
# what a field's MAC cost (27 MACs per execute, core_bench.py --profile). The same bytes as json.dumps.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _encoded(value: Any) -> str:
    """``_CANONICAL.encode(value)``, the same text, without the encoder's Python call for the commonest values.

    A run's signature encodes 14 field names and values (most of them None) per run: the encoder's own
    fast path for a string is this very function, None is "null" (D-51: a None field is not MACed), and
    an int (not a bool) is its ``int.__repr__``, as the encoder writes it (the run signature's format tag, D-55).
    """
    if value is None:
        return "null"
    if type(value) is str:
        return encode_basestring_ascii(value)
    if type(value) is int:
        return int.__repr__(value)
    return _CANONICAL.encode(value)


def _canonical(value: Any) -> bytes:
    return _CANONICAL.encode(value).encode()


def canonical_text(value: Any) -> str:
    """``value`` as :meth:`Keyring.mac` spells it, before UTF-8: for a MAC assembled from parts."""
    return _CANONICAL.encode(value)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Keyring:
    """The secret that signs (``current``) and the older ones that still verify."""

    current: bytes
    previous: tuple[bytes, ...] = ()

    @property
    def keys(self) -> tuple[bytes, ...]:
        """Every key held, the signing one first."""
        return (self.current, *self.previous)

    @cached_property
    def _by_id(self) -> dict[str, bytes]:
        # Computed once: every signature names its secret's id.
        out: dict[str, bytes] = {}
        for key in self.keys:
            out.setdefault(secret_id(key), key)
        return out

    @cached_property
    def current_id(self) -> str:
        return secret_id(self.current)

    def ids(self) -> list[str]:
        return list(self._by_id)

    def get(self, sid: str) -> bytes | None:
        return self._by_id.get(sid)

    def key_for(self, sid: str, what: str) -> bytes:
        key = self.get(sid)
        if key is None:
            raise WrongSecret(
                f"{what} was signed with another key (secret id {sid}); this process holds {', '.join(self.ids())}. "
                "Nothing was resumed or sent",
                details={"signed_with": sid, "held": self.ids()},
            )
        return key

    @cached_property
    def _derived(self) -> dict[str, Keyring]:
        return {}

    def derive(self, purpose: str) -> Keyring:
        """The keyring of one purpose: each held secret's key for it, in the same order."""
        # Kept per purpose: a console request or a link opens a token under the same keys each time.
        ring = self._derived.get(purpose)
        if ring is None:
            ring = self._derived[purpose] = Keyring(derive(self.current, purpose),
                                                    tuple(derive(k, purpose) for k in self.previous))
        return ring

    def sign(self, message: bytes) -> str:
        return mac_hex(self.current, message)

    def verifies(self, message: bytes, mac: str, chars: int = 64) -> bool:
        """Whether ``mac`` (its first ``chars`` hex digits) was made over ``message`` under any held key."""
        return isinstance(mac, str) and any(same(mac_hex(k, message)[:chars], mac) for k in self.keys)

    @staticmethod
    def mac(key: bytes, *parts: Any) -> str:
        """The MAC of ``parts`` as canonical JSON: what stored records are signed with (P-35)."""
        return mac_hex(key, _canonical(list(parts)))

    @staticmethod
    def macs(key: bytes, head: Sequence[Any], tails: Sequence[tuple[Any, Any]]) -> list[str]:
        """``[mac(key, *head, a, b) for a, b in tails]``, the same MACs: the shared head is hashed once.

        A run's signature is one MAC per field over ``["run", 2, run_id, name, value]`` (integrity.py);
        the canonical JSON of a list is its items' joined by ``,``, so the HMAC state after the head
        is copied for each field instead of hashing the head again (~0.4 of ``sign_run``'s cost).
        """
        base = hmac.new(key, ("[" + ",".join(_encoded(p) for p in head) + ",").encode(), hashlib.sha256)
        out = []
        for a, b in tails:
            h = base.copy()
            h.update((_encoded(a) + "," + _encoded(b) + "]").encode())
            out.append(h.hexdigest())
        return out


def keyring_for(store: Store) -> Keyring:
    """The keyring of an open store: its current secret and the older ones it was given.

    The one place the store's secret is read: everything else signs through the keyring it returns.
    """
    return Keyring(store.secret(), tuple(store.previous_secrets()))


def as_keyring(secret: bytes | Sequence[bytes] | Keyring) -> Keyring:
    """A keyring from one secret or several (the first signs): what token functions accept."""
    if isinstance(secret, Keyring):
        return secret
    if isinstance(secret, bytes):
        return Keyring(secret)
    keys = list(secret)
    return Keyring(keys[0], tuple(keys[1:])) if keys else Keyring(b"")


@dataclass(frozen=True)
class TokenFormat:
    """``<version>.<payload>.<mac>``: a JSON value, base64url, and a MAC under one purpose's key.

    ``purpose`` None signs with the secret itself (wait keys, older than keys
    derived per purpose). ``covers_version``: whether the MAC covers
    ``<version>.`` as well as the payload's text. The MAC always covers the
    payload's text, not its decoded bytes: base64 has spare bits, and a changed
    character must never decode to the same token.
    """

    version: str
    purpose: str | None
    mac_chars: int = 64
    covers_version: bool = True
    ensure_ascii: bool = True
    max_chars: int | None = None

    def _ring(self, secret: bytes | Sequence[bytes] | Keyring) -> Keyring:
        ring = as_keyring(secret)
        return ring.derive(self.purpose) if self.purpose else ring

    def _signed(self, payload: str) -> bytes:
        return (f"{self.version}.{payload}" if self.covers_version else payload).encode()

    def mint(self, secret: bytes | Sequence[bytes] | Keyring, value: Any) -> str:
        """A token for ``value``, signed under the current secret."""
        body = json.dumps(value, separators=(",", ":"), ensure_ascii=self.ensure_ascii).encode()
        payload = b64(body)
        return f"{self.version}.{payload}.{self._ring(secret).sign(self._signed(payload))[:self.mac_chars]}"

    def open(self, secret: bytes | Sequence[bytes] | Keyring, token: Any) -> Any:
        """The value of a genuine token, made under any held secret; None for a forged, altered or malformed one.

        A token whose value is JSON null cannot be told from a refusal: no format carries one.
        """
        if not isinstance(token, str) or token.count(".") != 2:
            return None
        if self.max_chars is not None and len(token) > self.max_chars:
            return None
        version, payload, mac = token.split(".")
        if version != self.version or not self._ring(secret).verifies(self._signed(payload), mac, self.mac_chars):
            return None
        try:
            return json.loads(unb64(payload))
        except ValueError:
            return None


# The formats of record. Changing one makes every token of it already handed out refuse: add a version instead.
WAIT_KEY = TokenFormat("w1", None, mac_chars=32, ensure_ascii=False)
APPROVAL_LINK = TokenFormat("a1", "approval-link", max_chars=1024)
CONSOLE_SESSION = TokenFormat("s1", "console/session", covers_version=False)
SIGN_IN_FLOW = TokenFormat("f1", "console/oidc", covers_version=False)

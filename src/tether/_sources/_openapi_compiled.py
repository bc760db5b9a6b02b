"""The compiled catalog of an OpenAPI source: what ``start()`` built, kept so a later start skips the parse.

A trivial ``tether run`` with four real descriptions spent seconds parsing
and inlining them on every start (D-41). The tools an OpenAPI document
gives depend only on its text, the source's settings and this compiler, so
the compiled form is keyed by all three: the spec's SHA-256, the settings,
tether's version and a digest of the compiler's own source files (an edited
compiler never reads an older compilation).

An entry is three rows (D-47). ``<key>`` is what a start decodes: per tool
its name, title, method, server, path and where its part is. ``<key>:parts``
is one text, each tool's description, input schema and operation as JSON
one after another: read and verified at start, decoded a tool at a time when
something asks for it (describe, search, a stub, a call; a trivial run never
does). ``<key>:outputs`` holds the output schemas, read only when a stub needs
one: they are most of the bytes (GitHub: 10.6 of 12.4 MB).

Finding the key needs the spec's digest; hashing GitHub's 12 MB on every
start is skipped when the file's stat matches a signed record of the digest
it had (``stat:<path>``, see ``recorded_digest``).

The cache is only a cache: the store that keeps it (see
``loader._SignedCatalogs``) signs each entry with the store's secret and
drops one that does not verify. Whether a tool is a read is never stored: it
is derived from the operation's HTTP method when the entry is restored.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.metadata
import json
import os
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

__all__ = ["CompiledCache", "Outputs", "Parts", "compile_catalog", "compiled_key", "no_gc", "record_digest",
           "recorded_digest", "remember"]

# Bumped when the compiled layout changes shape.
FORMAT = 3

# A stat record vouches only for a file whose last change is this much older
# than the read that hashed it. A write in the same timestamp tick as that
# read (coarse kernel clocks; FAT keeps 2 s) could change the content and
# leave every stat field as it was; past this, any later write moves mtime
# and ctime. Seconds.
RACY_SECONDS = 3.0


class CompiledCache(Protocol):
    """Where compiled catalogs are kept: ``get`` answers None for a miss or an entry it does not trust.

    ``get_text``/``put_text`` keep a text as it is, signed the same way, for
    a part decoded piece by piece.
    """

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, compiled: dict[str, Any]) -> None: ...

    def get_text(self, key: str) -> str | None: ...

    def put_text(self, key: str, text: str) -> None: ...


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Collection paused while a catalog is decoded and rebuilt.

    Megabytes of fresh acyclic dicts and tools trigger the cyclic collector
    over and over, each pass walking the whole heap (measured: 0.16 s instead
    of 0.27 s to decode four catalogs). Nothing awaits inside, so no other
    task runs with it paused.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _compiler_digest() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("openapi.py", "_openapi_bodies.py", "_openapi_compiled.py", "../tools/model.py"):
        try:
            h.update((here / name).read_bytes())
        except OSError:
            h.update(name.encode())
    try:
        h.update(importlib.metadata.version("tether").encode())
    except importlib.metadata.PackageNotFoundError:
        pass
    return h.hexdigest()[:16]


_COMPILER = _compiler_digest()


def compiled_key(inputs: dict[str, Any], digest: str) -> str:
    """The cache key: the spec's SHA-256 (hex), the source's settings and the compiler."""
    h = hashlib.sha256()
    h.update(f"openapi-compiled:{FORMAT}:{_COMPILER}\n".encode())
    h.update(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())
    h.update(f"\n{digest}".encode())
    return h.hexdigest()[:40]


def read_and_hash(path: str) -> tuple[bytes, str, os.stat_result, float]:
    """A spec file's bytes, their SHA-256, its stat before the read and when the read began (on a thread)."""
    began = time.time()
    before = os.stat(path)
    with open(path, "rb") as f:
        text = f.read()
    return text, hashlib.sha256(text).hexdigest(), before, began


def _stat_key(path: str) -> str:
    return "stat:" + hashlib.sha256(path.encode()).hexdigest()[:40]


def _stat_fields(st: os.stat_result) -> list[int]:
    # ctime cannot be set back by a user (utime, cp -p and tar set mtime; ctime moves to now).
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def recorded_digest(cache: CompiledCache, location: str) -> tuple[str, str | None]:
    """The spec file's absolute path, and the digest a signed record gives it while its stat is unchanged."""
    path = os.path.abspath(location)
    try:
        now = _stat_fields(os.stat(path))
    except OSError:
        return path, None  # reading it says why
    found = cache.get(_stat_key(path))
    if not isinstance(found, dict) or found.get("path") != path or found.get("stat") != now:
        return path, None
    digest = found.get("sha256")
    return path, digest if isinstance(digest, str) else None


def record_digest(cache: CompiledCache, path: str, before: os.stat_result, began: float, digest: str) -> None:
    """Vouch that ``path`` with the stat it had before the read has ``digest``: unless it changed since, or lately."""
    try:
        after = os.stat(path)
    except OSError:
        return
    changed = max(before.st_mtime_ns, before.st_ctime_ns) / 1e9
    if _stat_fields(after) != _stat_fields(before) or changed > began - RACY_SECONDS:
        return  # written during the read, or too lately to vouch for: the next start hashes it again
    cache.put(_stat_key(path), {"path": path, "stat": _stat_fields(before), "sha256": digest})


def latest_key(inputs: dict[str, Any], location: str) -> str:
    """Where the key of a source's latest compilation is kept, so the one before it can be dropped."""
    text = json.dumps([inputs, location], sort_keys=True, separators=(",", ":"))
    return "latest:" + hashlib.sha256(text.encode()).hexdigest()[:40]


def remember(cache: CompiledCache, inputs: dict[str, Any], location: str, key: str,
             compiled: tuple[dict[str, Any], str, dict[str, Any]]) -> None:
    """Store a compilation (``compile_catalog``) and drop the previous one of the same source."""
    head, parts, outputs = compiled
    pointer = latest_key(inputs, location)
    previous = cache.get(pointer)
    cache.put(f"{key}:outputs", outputs)
    cache.put_text(f"{key}:parts", parts)
    cache.put(key, head)  # last: a head is only ever found beside its parts
    cache.put(pointer, {"key": key})
    old = previous.get("key") if isinstance(previous, dict) else None
    if isinstance(old, str) and old != key:
        # A tombstone: the store's cache has no delete, and a miss is all a stale entry is good for.
        cache.put(old, {"gone": True})
        cache.put(f"{old}:outputs", {"gone": True})
        cache.put_text(f"{old}:parts", "")


def compile_catalog(tools: list[Any], operations: dict[str, Any], problems: list[dict[str, str]],
                    summary: str | None, servers: Any) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """A started source's catalog as its three rows: the head, the parts text, the output schemas.

    The head's row of a tool: name, title, method, server, path, whether it
    has an output schema, then where its part starts and ends in the text.
    """
    rows, texts, at = [], [], 0
    for t in tools:
        op = operations[t.name]
        text = json.dumps([t.description, t.input_schema, _row(op)], separators=(",", ":"), default=str)
        rows.append([t.name, t.title, op.method, op.server, op.path, t.output_schema is not None, at, at + len(text)])
        texts.append(text)
        at += len(text)
    head = {"format": FORMAT, "servers": servers if isinstance(servers, list) else [], "summary": summary,
            "problems": problems, "tools": rows}
    outputs = {"outputs": {t.name: json.dumps(t.output_schema, default=str) for t in tools
                           if t.output_schema is not None}}
    return head, "".join(texts), outputs


class Parts:
    """The parts text of one restored catalog (verified at start): a tool's part decoded when asked for."""

    def __init__(self, text: str) -> None:
        self.text = text

    def part(self, start: int, end: int) -> list[Any]:
        found = json.loads(self.text[start:end])
        if not (isinstance(found, list) and len(found) == 3 and isinstance(found[0], str)
                and isinstance(found[1], dict) and isinstance(found[2], list)):
            raise ValueError("not a compiled tool")  # signed, so only a bug in this module gets here
        return found


class Outputs:
    """The output schemas of one restored catalog, read from the cache at the first stub that needs one."""

    def __init__(self, cache: CompiledCache, key: str) -> None:
        self.cache, self.key = cache, key
        self._texts: dict[str, str] | None = None

    def schema(self, name: str) -> dict[str, Any] | None:
        if self._texts is None:
            found = self.cache.get(f"{self.key}:outputs")
            texts = found.get("outputs") if isinstance(found, dict) else None
            self._texts = texts if isinstance(texts, dict) else {}
        text = self._texts.get(name)
        if not isinstance(text, str):
            return None  # the part is gone or does not verify: a stub without a return type
        schema = json.loads(text)
        return schema if isinstance(schema, dict) else None


def _row(value: Any) -> Any:
    """A dataclass as the list of its fields' values, nested ones too: a third of the bytes of asdict()."""
    if is_dataclass(value) and not isinstance(value, type):
        return [_row(getattr(value, f.name)) for f in fields(value)]
    if isinstance(value, list):
        return [_row(v) for v in value]
    return value

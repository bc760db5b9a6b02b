"""The compiled catalog of an OpenAPI source: what ``start()`` built, kept so a later start skips the parse.

A trivial ``tether run`` with four real descriptions spent seconds parsing
and inlining them on every start (issue 22). The tools an OpenAPI document
gives depend only on its text, the source's settings and this compiler, so
the compiled form is keyed by all three: the spec's SHA-256, the settings,
tether's version and a digest of the compiler's own source files (an edited
compiler never reads an older compilation).

Output schemas are kept apart, as JSON text, and read only when a stub needs
one: they are most of the bytes (GitHub: 10.6 of 12.4 MB) and most runs never
look at them.

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
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

__all__ = ["CompiledCache", "Outputs", "compile_catalog", "compile_outputs", "compiled_key", "no_gc", "remember"]

# Bumped when the compiled layout changes shape.
FORMAT = 2


class CompiledCache(Protocol):
    """Where compiled catalogs are kept: ``get`` answers None for a miss or an entry it does not trust."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, compiled: dict[str, Any]) -> None: ...


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


def compiled_key(inputs: dict[str, Any], text: bytes) -> str:
    """The cache key: the spec's digest, the source's settings and the compiler."""
    h = hashlib.sha256()
    h.update(f"openapi-compiled:{FORMAT}:{_COMPILER}\n".encode())
    h.update(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\n")
    h.update(hashlib.sha256(text).digest())
    return h.hexdigest()[:40]


def latest_key(inputs: dict[str, Any], location: str) -> str:
    """Where the key of a source's latest compilation is kept, so the one before it can be dropped."""
    text = json.dumps([inputs, location], sort_keys=True, separators=(",", ":"))
    return "latest:" + hashlib.sha256(text.encode()).hexdigest()[:40]


def remember(cache: CompiledCache, inputs: dict[str, Any], location: str, key: str,
             compiled: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Store a compilation and drop the previous one of the same source (an edited spec, an upgrade)."""
    pointer = latest_key(inputs, location)
    previous = cache.get(pointer)
    cache.put(f"{key}:outputs", outputs)
    cache.put(key, compiled)
    cache.put(pointer, {"key": key})
    old = previous.get("key") if isinstance(previous, dict) else None
    if isinstance(old, str) and old != key:
        # A tombstone: the store's cache has no delete, and a miss is all a stale entry is good for.
        cache.put(old, {"gone": True})
        cache.put(f"{old}:outputs", {"gone": True})


def compile_catalog(tools: list[Any], operations: dict[str, Any], problems: list[dict[str, str]],
                    summary: str | None, servers: Any) -> dict[str, Any]:
    """A started source's tools and operations as JSON (output schemas as text)."""
    return {
        "format": FORMAT,
        "servers": servers if isinstance(servers, list) else [],
        "summary": summary,
        "problems": problems,
        "operations": _used(tools, operations),
        "tools": [{"name": t.name, "description": t.description, "title": t.title, "input_schema": t.input_schema,
                   "has_output": t.output_schema is not None} for t in tools],
    }


def compile_outputs(tools: list[Any]) -> dict[str, Any]:
    """The output schemas, kept apart (``<key>:outputs``): tool name -> the schema as JSON text."""
    return {"outputs": {t.name: json.dumps(t.output_schema, default=str) for t in tools
                        if t.output_schema is not None}}


class Outputs:
    """The output schemas of one restored catalog, read from the cache at the first stub that needs one."""

    def __init__(self, cache: CompiledCache, key: str) -> None:
        self.cache, self.key = cache, key
        self._texts: dict[str, str] | None = None

    def loader(self, name: str) -> Any:
        def load() -> dict[str, Any] | None:
            if self._texts is None:
                found = self.cache.get(f"{self.key}:outputs")
                texts = found.get("outputs") if isinstance(found, dict) else None
                self._texts = texts if isinstance(texts, dict) else {}
            text = self._texts.get(name)
            if not isinstance(text, str):
                return None  # the part is gone or does not verify: a stub without a return type
            schema = json.loads(text)
            return schema if isinstance(schema, dict) else None

        return load


def _used(tools: list[Any], operations: dict[str, Any]) -> dict[str, Any]:
    names = {t.name for t in tools}
    return {name: _row(op) for name, op in operations.items() if name in names}


def _row(value: Any) -> Any:
    """A dataclass as the list of its fields' values, nested ones too: a third of the bytes of asdict()."""
    if is_dataclass(value) and not isinstance(value, type):
        return [_row(getattr(value, f.name)) for f in fields(value)]
    if isinstance(value, list):
        return [_row(v) for v in value]
    return value

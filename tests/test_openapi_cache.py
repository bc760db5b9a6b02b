"""The compiled-catalog cache of OpenAPI sources: a second start reads it; a tampered entry is not trusted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tether._sources._openapi_compiled import compiled_key
from tether._sources.loader import _SignedCatalogs
from tether._sources.openapi import OpenAPISource
from tether._store import open_store

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'tether.db'}")
    yield s
    s.close()


def _key(source: OpenAPISource, spec: Path) -> str:
    return compiled_key(source._compile_inputs(), spec.read_bytes())  # noqa: SLF001 - where the cache looks


async def _start(spec: Path, store, **kw) -> OpenAPISource:
    source = OpenAPISource("github", spec, base_url="http://127.0.0.1:9",
                           cache=_SignedCatalogs(store, [store.secret()]), **kw)
    await source.start()
    return source


async def test_second_start_reads_the_compiled_catalog(store, tmp_path):
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    first = await _start(spec, store)
    key = _key(first, spec)
    assert store.get_listing(f"openapi:{key}") is not None
    assert store.get_listing(f"openapi:{key}:outputs") is not None  # output schemas kept apart

    second = await _start(spec, store)
    by_name = {t.name: t for t in first.tools()}
    assert [t.name for t in second.tools()] == [t.name for t in first.tools()]
    for tool in second.tools():
        built = by_name[tool.name]
        # Restored, not rebuilt: output schemas are read from the cache when asked for.
        assert tool.output_schema is None
        assert (tool.output_schema_loader is not None) == (built.output_schema is not None)
        assert (tool.input_schema, tool.annotations, tool.description) == \
            (built.input_schema, built.annotations, built.description)
        assert tool.returns_schema() == json.loads(json.dumps(built.output_schema))
    assert second.summary == first.summary and second.problems == first.problems

    # The spec changes: another key, compiled afresh.
    spec.write_text(spec.read_text().replace('"title":"GitHub', '"title":"Changed GitHub', 1))
    third = await _start(spec, store)
    assert _key(third, spec) != key
    assert third.tools()[0].output_schema is not None and store.get_listing(f"openapi:{_key(third, spec)}")
    # The compilation of the old text is dropped, not kept forever.
    for stale in (key, f"{key}:outputs"):
        assert json.loads(store.get_listing(f"openapi:{stale}")[0]["body"]) == {"gone": True}


async def test_a_tampered_entry_cannot_make_a_write_a_read(store, tmp_path):
    """The entry says which calls are writes (by method): edited in the store, it is dropped, not trusted."""
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    key = _key(await _start(spec, store), spec)
    row = store.get_listing(f"openapi:{key}")[0]
    body = json.loads(row["body"])
    for op in body["operations"].values():
        op[1] = "GET"  # the method (an operation's second field): every POST now claims to be a read
    store.put_listing(f"openapi:{key}", {"mac": row["mac"], "body": json.dumps(body)}, 0.0)

    again = await _start(spec, store)
    add = next(t for t in again.tools() if t.name == "issues_add_labels")
    assert add.output_schema is not None  # compiled afresh from the spec
    assert add.annotations.read_only is False and add.is_write

    # Signed with another secret (another deployment's entry): not trusted either.
    other = _SignedCatalogs(store, [b"another secret" * 3])
    other.put(key, body)
    again = await _start(spec, store)
    assert next(t for t in again.tools() if t.name == "issues_add_labels").is_write

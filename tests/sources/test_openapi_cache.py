"""The compiled-catalog cache of OpenAPI sources: a second start reads it; a tampered entry is not trusted.

A restored tool's description and input schema are read at first use, and a
spec whose stat matches its signed record is not read at all (D-47): these
tests change specs in the ways that must still be noticed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tether._sources import _openapi_compiled
from tether._sources._openapi_compiled import compiled_key
from tether._sources.loader import _SignedCatalogs
from tether._sources.openapi import OpenAPISource
from tether._store import open_store

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'tether.db'}")
    yield s
    s.close()


def _key(source: OpenAPISource, spec: Path) -> str:
    digest = hashlib.sha256(spec.read_bytes()).hexdigest()
    return compiled_key(source._compile_inputs(), digest)  # noqa: SLF001 - where the cache looks


# Every file this process opens while `_OPENED` is a list (an audit hook cannot be removed, so it stays idle).
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


async def _start_reading(spec: Path, store) -> tuple[OpenAPISource, bool]:
    """A started source, and whether starting it opened the spec file."""
    global _OPENED
    _OPENED = []
    try:
        source = await _start(spec, store)
    finally:
        opened, _OPENED = _OPENED, None
    return source, str(spec) in opened


@pytest.fixture
def vouch_now(monkeypatch):
    """Stat records for files written a moment ago (the tests' own specs): the racy window is closed."""
    monkeypatch.setattr(_openapi_compiled, "RACY_SECONDS", 0.0)


def _built_fields(tool) -> dict:
    """What a tool shows, output schema aside (a restored tool reads it when a stub asks)."""
    return {f.name: getattr(tool, f.name) for f in dataclasses.fields(tool)
            if f.compare and f.name != "output_schema"}


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
    assert store.get_listing(f"openapi:{key}:parts") is not None  # descriptions, input schemas, operations

    second = await _start(spec, store)
    by_name = {t.name: t for t in first.tools()}
    assert [t.name for t in second.tools()] == [t.name for t in first.tools()]
    for tool in second.tools():
        built = by_name[tool.name]
        # Restored, not rebuilt: description and input schema read at first use, output schemas when asked for.
        assert "input_schema" not in vars(tool) and "description" not in vars(tool)
        assert tool.output_schema is None
        assert (tool.output_schema_loader is not None) == (built.output_schema is not None)
        assert _built_fields(tool) == _built_fields(built)
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
    assert store.get_listing(f"openapi:{key}:parts")[0]["body"] == ""


async def test_a_tampered_entry_cannot_make_a_write_a_read(store, tmp_path):
    """The entry says which calls are writes (by method): edited in the store, it is dropped, not trusted."""
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    key = _key(await _start(spec, store), spec)
    row = store.get_listing(f"openapi:{key}")[0]
    body = json.loads(row["body"])
    for tool in body["tools"]:
        tool[2] = "GET"  # the method (a head row's third field): every POST now claims to be a read
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


async def test_a_tampered_part_is_not_read_at_first_use(store, tmp_path):
    """The parts (input schemas, operations) are verified at start, though decoded later: an edit means a rebuild."""
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    key = _key(await _start(spec, store), spec)
    row = store.get_listing(f"openapi:{key}:parts")[0]
    # Drop the required arguments and send every call to another path: both would change what is sent.
    edited = row["body"].replace('"required":["labels"]', '"required":[]').replace("/labels", "/elsewhere")
    assert edited != row["body"]
    store.put_listing(f"openapi:{key}:parts", {"mac": row["mac"], "body": edited}, 0.0)

    again = await _start(spec, store)
    add = next(t for t in again.tools() if t.name == "issues_add_labels")
    assert add.output_schema is not None  # compiled afresh: the edited part was never used
    assert "/elsewhere" not in add.target[1]


async def test_an_unchanged_spec_is_not_read_again(store, tmp_path, vouch_now):
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    first, read = await _start_reading(spec, store)
    assert read
    second, read = await _start_reading(spec, store)
    assert not read  # its stat matches the signed record: the digest is the recorded one
    assert [t.address for t in second.tools()] == [t.address for t in first.tools()]
    assert second.tools()[0].output_schema is None  # restored, not compiled


async def test_a_same_size_edit_with_the_old_mtime_is_compiled_again(store, tmp_path, vouch_now):
    """What `cp -p`, `tar x` or `touch -d` leave: content changed, size and mtime as they were."""
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    await _start(spec, store)
    before = spec.stat()
    text = spec.read_text()
    spec.write_text(text.replace("Add labels to an issue", "Add labels to an ISSUE", 1))
    os.utime(spec, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (spec.stat().st_size, spec.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    again, read = await _start_reading(spec, store)
    assert read  # ctime moved: the record no longer vouches
    assert next(t for t in again.tools() if t.name == "issues_add_labels").description.startswith("Add labels to an ISSUE")


async def test_a_spec_replaced_by_another_file_is_compiled_again(store, tmp_path, vouch_now):
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    await _start(spec, store)
    other = tmp_path / "other.json"
    other.write_text(spec.read_text().replace('"title":"GitHub', '"title":"Gitbuh', 1))  # same size
    os.replace(other, spec)  # another inode at the same path
    again, read = await _start_reading(spec, store)
    assert read and again.summary.startswith("Gitbuh")


async def test_a_file_changed_just_now_is_not_vouched_for(store, tmp_path):
    """A write in the same clock tick as the read could leave every stat field as it was: such a file is hashed."""
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    await _start(spec, store)
    _, read = await _start_reading(spec, store)
    assert read  # written a moment ago: no record yet, so hashed again (and restored by its digest)
    assert _openapi_compiled.recorded_digest(_SignedCatalogs(store, [store.secret()]), str(spec)) == (str(spec), None)


async def test_a_stat_record_from_another_secret_is_not_trusted(store, tmp_path, vouch_now):
    """A record that vouched for other content would make tether use another spec's catalog: it must be ours."""
    spec = tmp_path / "github.json"
    shutil.copy(FIXTURES / "real_github_trim.json", spec)
    await _start(spec, store)
    cache = _SignedCatalogs(store, [store.secret()])
    path, digest = _openapi_compiled.recorded_digest(cache, str(spec))
    assert digest == hashlib.sha256(spec.read_bytes()).hexdigest()
    key = _openapi_compiled._stat_key(path)  # noqa: SLF001 - where the record is kept
    row = store.get_listing(f"openapi:{key}")[0]
    other = _SignedCatalogs(store, [b"another secret" * 3])
    other.put(key, {**json.loads(row["body"]), "sha256": "0" * 64})
    assert _openapi_compiled.recorded_digest(cache, str(spec)) == (path, None)
    _, read = await _start_reading(spec, store)
    assert read

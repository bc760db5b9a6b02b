"""Fixtures shared across the test suite."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def store_url(tmp_path):
    """A SQLite store file of this test's own: what two runtimes ("two processes") share."""
    return f"sqlite:///{tmp_path}/tether.db"


@pytest.fixture(scope="session")
def pg_url():
    """A PostgreSQL URL for this session: ``TETHER_TEST_PG_URL``, else a throwaway cluster (tests/pg.py).

    Skips when no server can be had, unless ``TETHER_TEST_PG_REQUIRED=1`` (CI), where that is a failure.
    """
    import pg

    url = os.environ.get("TETHER_TEST_PG_URL")
    if url:
        yield url
        return
    reason = pg.missing_reason()
    if reason:
        if os.environ.get("TETHER_TEST_PG_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = pg.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


# --- ledger counts of the idempotency tests, shown at the end of the run ---------------
# The crash matrices and the per-call timeout tests add up how many runs ended
# how, how many requests the keyed API received and how many took effect, so
# CI output shows them (summed per matrix, in the order first reported).
_ledgers: dict[str, dict[str, int]] = {}


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    """A working directory the CLI and a runtime share: the store in ``tmp_path``, its own TETHER_HOME, the
    notes fixture's file (tests/fixtures/notes_tools.py), and no token from the environment."""
    url = f"sqlite:///{tmp_path}/tether.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TETHER_STORE_URL", url)
    monkeypatch.setenv("NOTES_FILE", str(tmp_path / "notes.jsonl"))
    monkeypatch.delenv("TETHER_TOKEN", raising=False)
    return tmp_path


@pytest.fixture
def ledger_report():
    def add(matrix: str, **counts: int) -> None:
        total = _ledgers.setdefault(matrix, {})
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n

    return add


def pytest_terminal_summary(terminalreporter):
    if not _ledgers:
        return
    terminalreporter.section("idempotency ledgers")
    for matrix, counts in _ledgers.items():
        terminalreporter.write_line(f"{matrix}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))

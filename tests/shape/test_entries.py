"""The path of one execute enters each file of its drawing at most twice (issue 21; docs/architecture.md
"How many times each file is entered"), counted by bench/file_entries.py's sys.setprofile hook."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def _entries_module():
    spec = importlib.util.spec_from_file_location("file_entries", BENCH / "file_entries.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_one_execute_enters_the_files_of_its_path_at_most_twice():
    counts, functions = await _entries_module().count()
    # The hook sees the path: the runtime once, the ledger per call state (a read and a write).
    assert counts["_runtime.py"] == 1 and counts["_engine/calls/ledger.py"] >= 5, counts
    # Starting, preparing and ending an attempt: begin and the attempt's task; the check and the spec
    # as one step; the handle made and awaited; the run created and finished.
    for name in ("_engine/launcher.py", "_engine/attempt/spec.py", "_engine/attempt/handle.py", "_engine/lifecycle.py",
                 "_engine/finish.py", "_hostwork.py"):
        assert counts[name] <= 2, (name, functions[name])

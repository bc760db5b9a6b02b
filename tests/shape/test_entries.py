"""The path of one execute enters each file of its drawing at most twice (docs/architecture.md "How many times
each file is entered"), counted by a ``sys.setprofile`` hook around one warm execute.

Every call into a file of src/tether from another file is one entry; a coroutine counts when it starts, not
when it resumes; a callback the event loop runs (a task's done callback) counts as an entry from outside.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from bench.common import bench_tools

import tether
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._store import open_store

PROGRAM = "import tools\nr = await tools.bench.get(id=1)\nawait tools.bench.put(id=1, value='x')\nr['value']\n"
SRC = str(Path(tether.__file__).resolve().parent) + "/"


def _file(code: types.CodeType) -> str | None:
    name = code.co_filename
    return name[len(SRC):] if name.startswith(SRC) else None


async def count() -> tuple[collections.Counter[str], dict[str, list[str]]]:
    """Entries per file of src/tether (and the functions entered) in one warm execute of a read and a write."""
    counts: collections.Counter[str] = collections.Counter()
    functions: dict[str, list[str]] = collections.defaultdict(list)
    seen: list[types.FrameType] = []  # held, so a started coroutine's frame id is never reused
    started: set[int] = set()

    def hook(frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        target = _file(frame.f_code)
        if target is None:
            return
        if frame.f_code.co_flags & (0x80 | 0x100 | 0x200):  # a coroutine or generator: its start only
            if id(frame) in started:
                return
            started.add(id(frame))
            seen.append(frame)
        back = frame.f_back
        caller = _file(back.f_code) if back is not None else None
        if caller == target:
            return
        counts[target] += 1
        functions[target].append(frame.f_code.co_qualname)

    with tempfile.TemporaryDirectory() as tmp:
        async with Runtime(tools=bench_tools(), store=open_store(f"sqlite:///{tmp}/entries.db"),
                           policy=Policy(writes="allow")) as rt:
            for _ in range(3):  # warm: the pool, the catalog's memos, the checker's verdict
                assert (await rt.execute(PROGRAM)).status == "completed"
            sys.setprofile(hook)
            try:
                result = await rt.execute(PROGRAM)
            finally:
                sys.setprofile(None)
            assert result.status == "completed", result
    return counts, functions


async def test_one_execute_enters_the_files_of_its_path_at_most_twice():
    counts, functions = await count()
    # The hook sees the path: the runtime once, the ledger per call state (a read and a write).
    assert counts["_runtime.py"] == 1 and counts["_engine/calls/ledger.py"] >= 5, counts
    # Starting, preparing and ending an attempt: begin and the attempt's task; the check and the spec
    # as one step; the handle made and awaited; the run created and finished.
    for name in ("_engine/launcher.py", "_engine/attempt/spec.py", "_engine/attempt/handle.py", "_engine/lifecycle.py",
                 "_engine/finish.py", "_hostwork.py"):
        assert counts[name] <= 2, (name, functions[name])

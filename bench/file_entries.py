"""How many times one execute enters each file of src/tether: the counts behind docs/architecture.md.

Not a benchmark (no timings, not run by run_all.py). One warm `execute` of a program making one read
and one write that policy allows, on SQLite, under a `sys.setprofile` hook: every call into a file of
src/tether from another file is one entry; a coroutine counts when it starts, not when it resumes;
a callback the event loop runs (a task's done callback) counts as an entry from outside.

    python bench/file_entries.py [--functions FILE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common, when loaded from a test

import common  # noqa: E402
from tether._engine.rules.policy import Policy  # noqa: E402
from tether._runtime import Runtime  # noqa: E402
from tether._store import open_store  # noqa: E402

PROGRAM = "import tools\nr = await tools.bench.get(id=1)\nawait tools.bench.put(id=1, value='x')\nr['value']\n"
SRC = str(Path(__file__).resolve().parent.parent / "src" / "tether") + "/"


def _file(code: types.CodeType) -> str | None:
    name = code.co_filename
    return name[len(SRC):] if name.startswith(SRC) else None


async def count() -> tuple[collections.Counter[str], dict[str, list[str]]]:
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
        async with Runtime(tools=common.bench_tools(), store=open_store(f"sqlite:///{tmp}/entries.db"),
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--functions", nargs="*", default=[], help="files whose entries to list by function")
    args = p.parse_args()
    counts, functions = asyncio.run(count())
    for name, n in counts.most_common():
        print(f"{n:4d}  {name}")
    for name in args.functions:
        print(f"\n{name}:")
        for fn, n in collections.Counter(functions[name]).most_common():
            print(f"{n:4d}  {fn}")


if __name__ == "__main__":
    main()

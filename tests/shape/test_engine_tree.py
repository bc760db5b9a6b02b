"""docs/architecture.md's tree of ``_engine/`` is the engine's map: every module is drawn, on a
line of its own, in the package that holds it, and every module drawn exists; so a module added, moved or
deleted says so there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
ENGINE = ROOT / "src" / "tether" / "_engine"


def _drawn() -> set[str]:
    """The modules the tree draws under ``_engine/``, relative to it (``attempt/driver.py``): a module's
    line starts with its file name, 4 spaces in at the top of the engine, 6 under a package's line."""
    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("  _engine/"))
    drawn, package = set(), None
    for line in lines[start + 1:]:
        if line.strip() and not line.startswith("    "):  # the next entry of src/tether/ (_store/ ...)
            break
        if head := re.match(r"^ {4}(\w+)/\s", line):
            package = head.group(1)
        elif entry := re.match(r"^ {4}(\w+\.py)\s", line):
            drawn.add(entry.group(1))
            package = None
        elif (entry := re.match(r"^ {6}(\w+\.py)\s", line)) and package:
            drawn.add(f"{package}/{entry.group(1)}")
    return drawn


def test_the_architecture_tree_draws_every_engine_module_in_its_package():
    on_disk = {p.relative_to(ENGINE).as_posix() for p in ENGINE.rglob("*.py") if p.name != "__init__.py"}
    drawn = _drawn()
    assert {"engine.py", "attempt/driver.py", "calls/ledger.py"} <= drawn  # the reader sees both levels
    assert sorted(on_disk - drawn) == [], "modules missing from docs/architecture.md's _engine/ tree"
    assert sorted(drawn - on_disk) == [], "docs/architecture.md's _engine/ tree draws modules that are gone"

"""Names say what a thing is (issue 21): no two classes under src/tether share a name, not even in another case.

Two classes called ``PythonSource`` (a config table and the running source) or ``McpSource`` beside
``MCPSource`` made every import a guess; a config model is named for the table it parses (``...Definition``,
``...Config``), the runtime object for what it does.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "src" / "tether"


def test_no_two_classes_share_a_name():
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name.lower(), []).append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert len(seen) > 100  # the walk sees the package's classes
    shared = {name: where for name, where in seen.items() if len(where) > 1}
    assert shared == {}

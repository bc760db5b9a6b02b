"""Names say what a thing is: no two classes under src/tether share a name, not even in another case.

Two classes called ``PythonSource`` (a config table and the running source) or ``McpSource`` beside
``MCPSource`` made every import a guess; a config model is named for the table it parses (``...Definition``,
``...Config``), the runtime object for what it does.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent.parent / "src" / "tether"


def test_no_two_classes_share_a_name():
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name.lower(), []).append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert len(seen) > 100  # the walk sees the package's classes
    shared = {name: where for name, where in seen.items() if len(where) > 1}
    assert shared == {}


# The public modules gather the interfaces users implement or construct from the private packages
# (tether.__init__ does the same for the top-level names).
PUBLIC_FACES = {"tether.store", "tether.sources"}


def _module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _own_names(tree: ast.Module) -> set[str]:
    """What a module defines itself (functions, classes, assignments at any depth of its top level)."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                own |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return own


def test_a_name_is_imported_from_the_module_that_defines_it():
    """No "importable from here, as before" shims: a caller names the home module, so moving a thing
    breaks its callers at once instead of leaving a second address that drifts. A package's __init__
    is its public face and may gather names; nothing else re-exports (its __all__ lists its own)."""
    modules = _module_names()
    own = {name: _own_names(ast.parse(path.read_text())) for name, path in modules.items()}
    found = []
    for root in (PACKAGE, PACKAGE.parent.parent / "tests", PACKAGE.parent.parent / "bench"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.module in modules):
                    continue
                if modules[node.module].name == "__init__.py" or node.module in PUBLIC_FACES:
                    continue
                for alias in node.names:
                    if alias.name in own[node.module] or f"{node.module}.{alias.name}" in modules:
                        continue
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
    assert found == []
    reexported = []
    for name, path in modules.items():
        if path.name == "__init__.py" or name in PUBLIC_FACES:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                listed = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}  # type: ignore[attr-defined]
                reexported += [f"{name}.{n}" for n in sorted(listed - own[name])]
    assert reexported == []

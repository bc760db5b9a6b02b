"""The run engine's shape stays readable: no import cycle, no reach into the Runtime's private state,
modules under 1,000 lines."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

SRC = Path(__file__).parent.parent.parent / "src"
PACKAGE = SRC / "tether"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


@functools.cache
def _graph() -> dict[str, set[str]]:
    return _imports(_modules())


def _imports(modules: dict[str, Path], *, typing: bool = False) -> dict[str, set[str]]:
    """Module -> the tether modules it imports, at the top or inside a function; type-only imports
    (under ``if TYPE_CHECKING``) counted only with ``typing``."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = set() if typing else {
                       id(n) for block in ast.walk(tree)
                       if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                       for n in block.body}
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            else:
                found = [a.name for a in node.names]
            for dep in found:
                # A package's own __init__ is not a cycle of its modules.
                if dep in modules and dep != name and not name.startswith(dep + "."):
                    graph.setdefault(name, set()).add(dep)
    return graph


def _cycles(graph: dict[str, set[str]], within: str) -> list[list[str]]:
    nodes = sorted(n for n in graph if n.startswith(within))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if not w.startswith(within):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for n in nodes:
        if n not in index:
            visit(n)
    return out


def test_tether_has_no_import_cycle():
    graph = _graph()
    assert graph["tether._runtime"] >= {"tether._engine.launcher", "tether._engine.attempt.handle"}  # the check sees imports
    assert "tether._tools.stubs" in graph["tether._tools.binding"]  # and imports inside functions or below
    for package in ("tether._engine.", "tether._server.", "tether."):
        assert _cycles(graph, package) == [], f"import cycle in {package}: {_cycles(graph, package)}"


def test_tether_has_no_import_cycle_counting_type_only_imports():
    # A cycle closed only by a TYPE_CHECKING import is still two modules that cannot change apart
    # (_server/mcp.py and urlmode.py were one: the channels now use _server/channels.py's interface;
    # the engine's services and the loader named the Runtime that imports them: they take the Engine,
    # the loader its catalog, attempts and events; envelopes name the boundary's Attempted).
    graph = _imports(_modules(), typing=True)
    assert "tether._server.channels" in graph["tether._server.urlmode"]  # the check sees type-only imports
    assert "tether._engine.engine" in graph["tether._engine.worker"]  # a type-only import of the Engine
    for package in ("tether._engine.approvals.", "tether._server.", "tether._engine.", "tether."):
        assert _cycles(graph, package) == [], f"import cycle in {package}: {_cycles(graph, package)}"


def test_only_the_capabilities_module_reads_the_secret_or_computes_a_mac():
    """One HMAC and rotation implementation: every token and stored MAC is made by
    tether._engine.approvals.capabilities, from the keyring it builds; nothing else reads the store's secret."""
    home = PACKAGE / "_engine" / "approvals" / "capabilities.py"
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == home or path.parent.name == "_store":  # the store keeps the secret; it does not sign
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                text = ast.unparse(node.func)
                if text in ("hmac.new", "hmac.digest") or node.func.attr in ("secret", "previous_secrets"):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {text}")
    assert found == []


def test_the_attempt_never_imports_the_runtime():
    graph = _graph()
    reach = set()
    todo = ["tether._engine.attempt.driver"]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in reach:
                reach.add(dep)
                todo.append(dep)
    assert "tether._runtime" not in reach


def test_nothing_under_the_engine_imports_the_runtime():
    """Services receive the Engine (tether._engine.engine), never the Runtime facade over it:
    not at the top, not inside a function, not for type annotations only."""
    graph = _imports(_modules(), typing=True)
    assert "tether._engine.engine" in graph["tether._engine.launcher"]  # the check sees the engine's imports
    found = sorted(name for name, deps in graph.items()
                   if name.startswith("tether._engine.") and "tether._runtime" in deps)
    assert found == []


def test_callbacks_travel_as_one_hooks_object():
    """on_approval / on_progress / on_question reach an attempt as one Hooks (tether._engine.engine); below
    the Runtime no function takes them as three parameters (the effect boundary gets the hooks' parts)."""
    found = []
    for path in (PACKAGE / "_engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if {"on_approval", "on_progress", "on_question"} <= names:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    # The effect boundary (tether._engine.calls.boundary) is built from the hooks' parts.
    assert [f for f in found if "boundary.py" not in f] == []


def test_nothing_outside_the_runtime_reaches_into_its_private_fields():
    reach = re.compile(r"\b(?:rt|runtime|self\.rt|server\.rt)\._[a-z]")
    found = [f"{path.relative_to(SRC)}:{n}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if path.name != "_runtime.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if reach.search(line)]
    assert found == []


def test_modules_stay_under_a_thousand_lines():
    long = {str(p.relative_to(SRC)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) >= 1000}
    assert long == {}

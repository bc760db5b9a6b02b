"""A source kind is one module and one registration: the loader and the config ask the registry.

A kind registered here, with nothing else edited, is loaded from a run's recorded definition, its tools
called by a program, and it receives the question handler because its registration says it asks questions.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Literal

import pytest

from tether._runtime import Runtime
from tether._sources.kinds import KINDS, SourceContext, SourceKind, _Definition, kind_of, register
from tether._sources.loader import SourceSet
from tether._store.sqlite import SQLiteStore
from tether._tools.model import Annotations, Tool
from tether.errors import ConfigError

PACKAGE = Path(__file__).parent.parent.parent / "src" / "tether"
BUILT = []


class GreetingDefinition(_Definition):
    type: Literal["greeting"]
    namespace: str
    word: str = "hello"


class GreetingSource:
    """The whole of a kind's module: a Source and its from_definition."""

    problems: list[dict[str, str]] = []
    summary = "Greets."
    started = True

    def __init__(self, namespace: str, word: str) -> None:
        self.namespace, self.word = namespace, word

    async def start(self) -> None:
        pass

    def tools(self) -> list[Tool]:
        async def greet(args: dict[str, Any]) -> str:
            return f"{self.word}, {args['name']}"

        return [Tool(self.namespace, "greet", "Greet someone.",
                     {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                     greet, annotations=Annotations(read_only=True))]

    async def ensure_live(self) -> None:
        pass

    async def close(self) -> None:
        pass


def from_definition(definition: dict[str, Any], context: SourceContext) -> GreetingSource:
    BUILT.append(context)
    return GreetingSource(definition["namespace"], definition.get("word", "hello"))


@pytest.fixture
def greeting_kind():
    kind = register(SourceKind("greeting", GreetingDefinition, f"{__name__}:from_definition", asks_questions=True))
    yield kind
    del KINDS["greeting"]


async def test_a_registered_kind_is_loaded_and_its_tools_called(tmp_path, greeting_kind):
    async with Runtime(store=SQLiteStore(f"sqlite:///{tmp_path / 's.db'}"), type_check=False) as rt:
        sources = SourceSet(rt.catalog, attempts=rt.engine.attempts, events=rt.engine.events, store=rt.store)
        try:
            [entry] = await sources.add([{"type": "greeting", "namespace": "hi", "word": "hej"}])
            assert entry.ok, entry.error
            r = await rt.execute("import tools\nawait tools.hi.greet(name='Ada')")
        finally:
            await sources.close()
    assert r.status == "completed" and r.result == "hej, Ada", r.error
    # It asks questions, so its builder was given the handler that puts one to the run's user.
    assert BUILT[-1].ask is not None


async def test_an_unknown_kind_fails_its_source_and_names_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="knows mcp, openapi, python"):
        kind_of("greeting")
    async with Runtime(store=SQLiteStore(f"sqlite:///{tmp_path / 's.db'}"), type_check=False) as rt:
        sources = SourceSet(rt.catalog, attempts=rt.engine.attempts, events=rt.engine.events, store=rt.store)
        try:
            [entry] = await sources.add([{"type": "greeting", "namespace": "hi"}])
        finally:
            await sources.close()
    assert not entry.ok and "unknown source type 'greeting'" in (entry.error or "")


def test_no_module_but_the_registry_names_a_source_kind():
    """The if-chain and the ``type == "mcp"`` special cases were four places a new kind had to edit."""
    kinds = set(KINDS)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "kinds.py" and path.parent.name == "_sources":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Constant) and s.value in kinds for s in sides) and \
                        any("type" in ast.unparse(s) for s in sides):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert found == []

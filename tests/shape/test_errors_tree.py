"""Error codes map one to one to classes: ``except InvalidArguments`` catches every ``invalid_arguments``.

The tree is walked three ways: the classes themselves (one code each, all in tether.errors), every raise site
in src/tether (AST: a site picks a class, never passes a code), and the documented lists (the errors.py
docstring and the README's "Errors" section) against the classes.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import tether.errors as errors
from tether._runtime import Runtime
from tether._store.sqlite import SQLiteStore
from tether.errors import InvalidArguments, TetherError, UsageError

SRC = Path(__file__).parent.parent.parent / "src"
README = Path(__file__).parent.parent.parent / "README.md"


def _tree() -> list[type[TetherError]]:
    # Every module imported, so a class defined anywhere under tether is seen.
    for path in (SRC / "tether").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    out, todo = [], [TetherError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def test_every_code_has_exactly_one_class_and_it_lives_in_tether_errors():
    classes = _tree()
    by_code: dict[str, list[str]] = {}
    for cls in classes:
        assert "code" in vars(cls), f"{cls.__qualname__} inherits its code: give it its own, or it is not a class"
        # Defined in tether.errors (the ones tether exports say __module__ "tether", as every public name does).
        assert getattr(errors, cls.__name__, None) is cls, f"{cls.__qualname__} is defined in {cls.__module__}"
        by_code.setdefault(cls.code, []).append(cls.__qualname__)
    shared = {code: names for code, names in by_code.items() if len(names) > 1}
    assert not shared, f"codes with more than one class: {shared}"


def test_no_raise_site_passes_a_code_it_chooses_the_class():
    """A ``code=`` at a raise site is how ``UsageError(code="invalid_arguments")`` escaped ``except InvalidArguments``."""
    names = {cls.__name__ for cls in _tree()}
    found = []
    for path in (SRC / "tether").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not any(k.arg == "code" for k in node.keywords):
                continue
            func = node.func
            callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            # type(exc)(..., code=...) re-raises an error under a code of the caller's choosing too.
            rebuilt = isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "type"
            if callee in names or rebuilt:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(func)}(code=...)")
    assert not found, "\n".join(found)


def _documented(text: str) -> dict[str, str]:
    """Class -> code from a drawn tree (``├── Name   code ...``)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^[\s│├└─]*([A-Z]\w+)\s+([a-z0-9_]+)\b", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_the_documented_trees_list_exactly_the_classes_and_their_codes():
    classes = {cls.__name__: cls.code for cls in _tree()}
    docstring = errors.__doc__ or ""
    drawn = docstring[docstring.index("::"):docstring.index("\n\nEach code")]
    assert _documented(drawn) == classes
    readme = README.read_text()
    section = readme[readme.index("### Errors"):]
    block = section[section.index("```") + 3:]
    assert _documented(block[:block.index("```")]) == classes
    # The drawing is the same in both, line for line.
    assert [line.strip() for line in block[:block.index("```")].strip().splitlines()] == \
           [line.strip() for line in drawn[2:].strip().splitlines()]


def test_a_bad_argument_to_the_python_api_is_caught_as_invalid_arguments(tmp_path):
    """Once raised as a generic UsageError carrying the code, which ``except InvalidArguments`` missed."""
    with pytest.raises(InvalidArguments) as caught:
        Runtime(store=SQLiteStore(f"sqlite:///{tmp_path / 's.db'}"), principal="")
    assert caught.value.code == "invalid_arguments" and isinstance(caught.value, UsageError)
    assert caught.value.to_dict()["next_action"] == InvalidArguments.next_action

"""OpenAPI schemas as tether's tools take them: ``$ref``s resolved and inlined within a budget, and
OpenAPI 3.0's dialect turned into JSON Schema. Split from openapi.py, which reads operations."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tether._sources import _openapi_bodies as bodies

# Values under these keys are data, not schemas: never chase $refs into them.
_LITERAL_KEYS = {"example", "examples", "default", "enum", "const"}


class Unsupported(Exception):
    """An operation uses something tether does not call; it is skipped."""


# The most nodes one operation's schema may have once its $refs are inlined: the
# largest in GitHub's, Box's and OpenAI's descriptions have 1,300 to 5,500.
MAX_INLINED_NODES = 200_000


class Refs:
    """A description's ``$ref``s: looked up, followed, and inlined within a node budget."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        self._left = MAX_INLINED_NODES

    def lookup(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise Unsupported(f"external $ref {ref!r} is not supported")
        node: Any = self.doc
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise Unsupported(f"$ref {ref!r} does not resolve")
        return node

    def deref(self, node: Any) -> Any:
        """Follow a chain of $refs (parameters, bodies, responses)."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
            if node["$ref"] in seen:
                raise Unsupported(f"circular $ref {node['$ref']!r}")
            seen.add(node["$ref"])
            node = self.lookup(node["$ref"])
        return node

    def inline(self, node: Any) -> Any:
        """A schema with every local $ref inlined; a ref back into itself becomes ``{}``.

        A ref used several times is copied each time, so a few components that
        each name the one before twice expand exponentially: past
        ``MAX_INLINED_NODES`` the schema is refused (``Unsupported``).
        """
        self._left = MAX_INLINED_NODES
        return self._inline(node, ())

    def _inline(self, node: Any, active: tuple[str, ...]) -> Any:
        if isinstance(node, (list, Mapping)):
            self._left -= 1
            if self._left < 0:
                raise Unsupported(f"a schema expands past {MAX_INLINED_NODES:,} nodes once its $refs are inlined")
        if isinstance(node, list):
            return [self._inline(v, active) for v in node]
        if not isinstance(node, Mapping):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in active:
                return {}
            target = self._inline(self.lookup(ref), (*active, ref))
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            if not siblings:
                return target
            # 3.1 allows keywords beside $ref; they refine the target.
            return {**(target if isinstance(target, dict) else {}), **self._inline(siblings, active)}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "properties" and isinstance(value, Mapping):
                # Property names are not keywords: a property called "default" is a schema.
                out[key] = {name: self._inline(sub, active) for name, sub in value.items()}
            elif key in _LITERAL_KEYS:
                out[key] = copy.deepcopy(value)
            else:
                out[key] = self._inline(value, active)
        if isinstance(node.get("discriminator"), Mapping):
            bodies.tag_variants(node, out)
        return out


def json_schema(node: Any, *, request: bool) -> Any:
    """OpenAPI 3.0 schema dialect to JSON Schema; 3.1 schemas pass through.

    In a request, ``readOnly`` properties are dropped: the server sets them.
    """
    if isinstance(node, list):
        return [json_schema(v, request=request) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _LITERAL_KEYS:
            out[key] = value
        elif key in ("nullable", "discriminator", "xml", "externalDocs"):
            continue
        elif key == "properties" and isinstance(value, dict):
            props = {
                name: json_schema(sub, request=request)
                for name, sub in value.items()
                if not (request and isinstance(sub, dict) and sub.get("readOnly"))
            }
            out[key] = props
        elif isinstance(value, (dict, list)):
            out[key] = json_schema(value, request=request)
        else:
            out[key] = value
    if request and isinstance(out.get("properties"), dict) and isinstance(out.get("required"), list):
        out["required"] = [n for n in out["required"] if n in out["properties"]]
    for bound in ("Minimum", "Maximum"):
        flag = out.get(f"exclusive{bound}")
        if isinstance(flag, bool):
            del out[f"exclusive{bound}"]
            if flag and bound.lower() in out:
                out[f"exclusive{bound}"] = out.pop(bound.lower())
    if node.get("nullable") is True:
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = [kind, "null"]
        elif kind is None and out:
            out = {"anyOf": [out, {"type": "null"}]}
    return out

"""An OpenAPI operation as tether keeps it, and what its tool is called, says and sends.

The operation's parameters and its compiled form (``restore_operation``); its tool's name, argument names,
description, annotations and output schema, read from the document; and how a parameter's value is written
on the wire (``simple`` for path and header parameters, ``query`` for the query string). The source that calls
operations is :mod:`tether._sources.openapi`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether._sources._names import identifier as _identifier
from tether._sources._names import unique as _unique
from tether._sources._openapi_schema import Refs, Unsupported, json_schema
from tether._tools.model import Annotations

READ_METHODS = {"get", "head", "options"}


@dataclass
class Param:
    arg: str  # keyword argument name
    location: str  # path | query | header | body (one body property) | body* (the whole body)
    wire: str  # name on the wire
    style: str = "form"
    explode: bool = True
    as_json: bool = False  # a `content:` parameter whose media type is JSON: sent as JSON text
    binary: bool = False  # a multipart file field


@dataclass
class Operation:
    name: str
    method: str
    path: str
    params: list[Param] = field(default_factory=list)
    media_type: str | None = None
    body_kind: str = "json"  # see _openapi_bodies.body_kind
    body_required: bool = False
    server: str | None = None


_OPERATION_FIELDS = tuple(f.name for f in dataclasses.fields(Operation))
_PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(Param))


def restore_operation(raw: list[Any]) -> Operation:
    """An operation from its compiled form: its fields' values in order, each parameter's too."""
    values = dict(zip(_OPERATION_FIELDS, raw, strict=True))
    values["params"] = [Param(**dict(zip(_PARAM_FIELDS, p, strict=True))) for p in values["params"]]
    return Operation(**values)


def server_url(server: Mapping[str, Any]) -> str | None:
    url = server.get("url")
    if not isinstance(url, str):
        return None
    for var, spec in (server.get("variables") or {}).items():
        if isinstance(spec, Mapping) and "default" in spec:
            url = url.replace("{" + var + "}", str(spec["default"]))
    return url


def is_json(media_type: str) -> bool:
    base = media_type.split(";")[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def _snake(text: str) -> str:
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()


def operation_name(operation_id: Any, method: str, path: str) -> str:
    if isinstance(operation_id, str) and _snake(operation_id):
        return _identifier(_snake(operation_id), "op")
    return _identifier(_snake(f"{method}_{path}"), "op")


def arg_name(wire: str, location: str, taken: Mapping[str, Any]) -> str:
    # Valid identifiers keep the API's own spelling; others are snake_cased.
    arg = wire if wire.isidentifier() else _snake(wire)
    arg = _identifier(arg, "arg")
    if arg in taken:
        arg = _unique(f"{arg}_{location}", set(taken))
    return arg


def info_summary(info: Any) -> str | None:
    """``info.title``, and the description's first sentence when the title is all there is to say little."""
    if not isinstance(info, Mapping):
        return None
    title, text = info.get("title"), info.get("description")
    title = title if isinstance(title, str) else ""
    text = text if isinstance(text, str) else ""
    first = " ".join(text.split()).split(". ")[0].rstrip(".")
    if title and first and len(title) < 40 and first.lower() != title.lower():
        return f"{title}: {first}"
    return " ".join((title or first).split()) or None


@functools.lru_cache(maxsize=None)
def tool_annotations(method: str) -> Annotations:
    return Annotations(
        read_only=method in READ_METHODS,
        destructive=method == "delete",
        idempotent=method in ("put", "delete") or method in READ_METHODS,
        open_world=True,  # every call goes to an API outside tether
    )


def description(op: Mapping[str, Any], operation: Operation) -> str:
    parts = [s.strip() for s in (op.get("summary"), op.get("description")) if isinstance(s, str) and s.strip()]
    if len(parts) == 2 and parts[0] == parts[1]:
        parts.pop()
    text = "\n\n".join(parts) or f"{operation.method} {operation.path}"
    return f"(deprecated) {text}" if op.get("deprecated") else text


def output_schema(refs: Refs, op: Mapping[str, Any]) -> dict[str, Any] | None:
    responses = op.get("responses") or {}
    for status, response in sorted(responses.items(), key=lambda kv: str(kv[0])):
        if not str(status).startswith("2"):
            continue
        try:
            response = refs.deref(response)
            for media_type, media in ((response or {}).get("content") or {}).items():
                if is_json(media_type) and isinstance(media, Mapping) and isinstance(media.get("schema"), Mapping):
                    return json_schema(refs.inline(media["schema"]), request=False)
        except Unsupported:
            return None  # the output schema only informs; it never blocks a call
        return None
    return None


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def simple(value: Any, explode: bool) -> str:
    if isinstance(value, list):
        return ",".join(_scalar(v) for v in value)
    if isinstance(value, dict):
        pairs = [f"{k}={_scalar(v)}" if explode else f"{k},{_scalar(v)}" for k, v in value.items()]
        return ",".join(pairs)
    return _scalar(value)


def query(p: Param, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        if p.style == "deepObject":
            return [(f"{p.wire}[{k}]", _scalar(v)) for k, v in value.items()]
        if p.explode:
            return [(str(k), _scalar(v)) for k, v in value.items()]
        return [(p.wire, ",".join(f"{k},{_scalar(v)}" for k, v in value.items()))]
    if isinstance(value, list):
        if p.explode and p.style == "form":
            return [(p.wire, _scalar(v)) for v in value]
        sep = {"spaceDelimited": " ", "pipeDelimited": "|"}.get(p.style, ",")
        return [(p.wire, sep.join(_scalar(v) for v in value))]
    return [(p.wire, _scalar(value))]

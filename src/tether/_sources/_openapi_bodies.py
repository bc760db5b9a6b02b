"""Request bodies of OpenAPI operations: which arguments a body becomes, and how a call's values are sent.

One rule for every operation: when the body is a JSON, form or multipart
object — a plain object, an ``allOf`` of objects merged, or a ``oneOf`` /
``anyOf`` whose object variants are merged (a property is required only when
every variant requires it) — its properties become keyword arguments, unless
one of them has the name of a path, query or header parameter; then the whole
body is the one argument ``body``. Other bodies are ``body``: a text body is a
string, a binary one (``application/octet-stream``, ``application/cbor``…) is
base64 text or bytes.

A file field of a multipart body (``format: binary``) takes base64 text, bytes,
or ``{"base64": ..., "filename": ..., "content_type": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from tether.errors import InvalidArguments

__all__ = ["BINARY_ARG", "body_kind", "encode_binary", "encode_body", "file_schema", "object_view", "pick_media_type",
           "tag_variants"]

# What a program passes for binary content: the schema the tool shows for it.
BINARY_ARG: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "contentEncoding": "base64"},
        {"type": "object", "properties": {"base64": {"type": "string"}, "filename": {"type": "string"},
                                          "content_type": {"type": "string"}},
         "required": ["base64"], "additionalProperties": False},
    ],
    "description": "binary content: base64 text, or {\"base64\": ..., \"filename\": ..., \"content_type\": ...}",
}

_KINDS = ("json", "multipart", "form", "text", "binary")


def body_kind(media_type: str) -> str:
    """How a body of this media type is sent: json, multipart, form, text or binary."""
    base = media_type.split(";")[0].strip().lower()
    if base == "application/json" or base.endswith("+json"):
        return "json"
    if base == "multipart/form-data":
        return "multipart"
    if base == "application/x-www-form-urlencoded":
        return "form"
    if base.startswith("text/") or base in ("application/sdp", "application/xml"):
        return "text"
    return "binary"


def pick_media_type(content: dict[str, Any]) -> str:
    """The media type a call sends: JSON first, then multipart, form, text, binary."""
    ranked = sorted(content, key=lambda m: (_KINDS.index(body_kind(m)), m.split(";")[0].strip() != "application/json"))
    return ranked[0]


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if isinstance(kind, list):
        return "object" in kind
    return kind in ("object", None)


def object_view(schema: Any) -> tuple[dict[str, Any], list[str]] | None:
    """The properties and required names of an object body, combinators merged; None when it is not one."""
    if not isinstance(schema, dict) or not _is_object(schema):
        return None
    props: dict[str, Any] = dict(schema.get("properties") or {}) if isinstance(schema.get("properties"), dict) else {}
    required = [n for n in schema.get("required") or [] if isinstance(n, str)]
    for part in schema.get("allOf") or []:
        view = object_view(part)
        if view is None:
            if isinstance(part, dict) and not part.get("properties") and _is_object(part):
                continue  # a constraint-only part ({"required": [...]}, a description)
            return None
        for name, sub in view[0].items():
            props[name] = _merge_property(props.get(name), sub)
        required += [n for n in view[1] if n not in required]
    for combinator in ("oneOf", "anyOf"):
        variants = [object_view(v) for v in schema.get(combinator) or []]
        objects = [v for v in variants if v is not None and v[0]]
        if not objects:
            if schema.get(combinator) and not props and not any(v is not None for v in variants):
                return None  # a union of non-objects (a string or a list): not a set of arguments
            continue
        for vprops, _ in objects:
            for name, sub in vprops.items():
                props[name] = _merge_property(props.get(name), sub)
        if len(objects) == len(variants):
            # Required in every variant: required; otherwise it depends on the variant chosen.
            always = set.intersection(*(set(r) for _, r in objects))
            required += [n for n in objects[0][1] if n in always and n not in required]
    required = [n for n in required if n in props]
    return props, required


def _merge_property(old: Any, new: Any) -> Any:
    """One property declared by several variants: equal schemas stay one; tags (enum/const) are united."""
    if old is None or old == new:
        return new
    old_tags, new_tags = _tags(old), _tags(new)
    if old_tags is not None and new_tags is not None:
        merged = list(dict.fromkeys([*old_tags, *new_tags]))
        out = {k: v for k, v in old.items() if k not in ("const", "enum")}
        return {**out, "enum": merged}
    if (old_tags is None) != (new_tags is None) and isinstance(old, dict) and isinstance(new, dict):
        # A variant's tag written beside its own untagged declaration: the tag refines it.
        return {**old, **new} if new_tags is not None else {**new, **old}
    earlier = old["anyOf"] if isinstance(old, dict) and set(old) == {"anyOf"} else [old]
    return {"anyOf": [*earlier, new]}


def _tags(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list) and schema.get("type") in ("string", None):
        return list(schema["enum"])
    return None


def file_schema(schema: Any) -> Any:
    """A multipart property schema with its binary parts shown as what a program passes."""
    if not isinstance(schema, dict):
        return schema
    if schema.get("format") == "binary" or "contentMediaType" in schema:
        return {**BINARY_ARG, **({"description": schema["description"] + " (" + BINARY_ARG["description"] + ")"}
                                 if isinstance(schema.get("description"), str) else {})}
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        return {**schema, "items": file_schema(schema["items"])}
    return schema


def is_file_schema(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    if schema.get("format") == "binary" or "contentMediaType" in schema:
        return True
    return schema.get("type") == "array" and is_file_schema(schema.get("items"))


def encode_binary(value: Any, what: str) -> tuple[bytes, str | None, str | None]:
    """(content, filename, content type) from bytes, base64 text or the documented dict."""
    filename = content_type = None
    if isinstance(value, dict):
        filename, content_type = value.get("filename"), value.get("content_type")
        value = value.get("base64")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), filename, content_type
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True), filename, content_type
        except (binascii.Error, ValueError):
            raise InvalidArguments(
                f"{what} is binary content: pass base64 text (base64.b64encode(data).decode()), bytes, "
                "or {\"base64\": ..., \"filename\": ..., \"content_type\": ...}; the value given is not base64",
            ) from None
    raise InvalidArguments(f"{what} is binary content: pass base64 text, bytes or "
                           f"{{\"base64\": ..., \"filename\": ...}}, not {type(value).__name__}")


def form_value(value: Any) -> str:
    """A non-file field of a form or multipart body: scalars as text, anything else as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "" if value is None else str(value)


def tag_variants(node: Mapping[str, Any], out: dict[str, Any]) -> None:
    """A discriminated union's tag property, in each variant, as the one value that variant takes.

    The tag of a variant is known only from its $ref (the mapping, or the
    schema's name), so it is written in while the refs are still visible:
    a stub then shows it as ``Literal["..."]``.
    """
    prop = node["discriminator"].get("propertyName")
    mapping = node["discriminator"].get("mapping") or {}
    by_ref = {ref: tag for tag, ref in mapping.items() if isinstance(ref, str)} if isinstance(mapping, Mapping) else {}
    if not isinstance(prop, str):
        return
    for combinator in ("oneOf", "anyOf"):
        raw, inlined = node.get(combinator), out.get(combinator)
        if not isinstance(raw, list) or not isinstance(inlined, list):
            continue
        for i, (variant, schema) in enumerate(zip(raw, inlined)):
            ref = variant.get("$ref") if isinstance(variant, Mapping) else None
            if not isinstance(ref, str) or not isinstance(schema, dict):
                continue
            tag = by_ref.get(ref, ref.rsplit("/", 1)[-1])
            props = schema.get("properties")
            current = props.get(prop) if isinstance(props, dict) else None
            if isinstance(current, dict) and ("const" in current or len(current.get("enum") or []) == 1):
                continue  # the variant says its tag itself
            tag_schema = {"type": "string", "enum": [tag]}
            if isinstance(props, dict):
                inlined[i] = {**schema, "properties": {**props, prop: {**(current or {}), **tag_schema}}}
            else:
                inlined[i] = {**schema, "allOf": [*(schema.get("allOf") or []), {"properties": {prop: tag_schema}}]}


Parts = list[tuple[str, tuple[str | None, bytes, str | None]]]


def encode_body(name: str, kind: str, media_type: str | None, binary: set[str],
                body: Any) -> tuple[bytes | None, Parts | None, dict[str, Any] | None]:
    """(content, multipart parts, form fields) for httpx, by the operation's body kind."""
    where = f"{name}: the request body"
    if kind == "json":
        return json.dumps(body).encode(), None, None
    if kind == "text":
        if not isinstance(body, str):
            raise InvalidArguments(f"{where} is text ({media_type}): pass a str")
        return body.encode(), None, None
    if kind == "binary":
        return encode_binary(body, where)[0], None, None
    if not isinstance(body, Mapping):
        raise InvalidArguments(f"{where} is a form ({media_type}): pass a dict of its fields")
    fields: dict[str, Any] = {}
    parts: Parts = []
    for field_name, value in body.items():
        if value is None:
            continue
        if field_name in binary:
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                data, filename, content_type = encode_binary(item, f"{name}: {field_name!r}")
                parts.append((field_name, (filename or f"{field_name}{i or ''}", data,
                                           content_type or "application/octet-stream")))
        elif kind == "multipart":
            # Every field a part of its own (no filename): httpx sends multipart only when given parts.
            for item in value if isinstance(value, list) else [value]:
                parts.append((field_name, (None, form_value(item).encode(), None)))
        else:
            fields[field_name] = [form_value(v) for v in value] if isinstance(value, list) else form_value(value)
    if kind == "multipart":
        return None, parts, None
    return None, None, fields

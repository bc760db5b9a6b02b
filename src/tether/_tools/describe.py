"""``describe()`` and ``sources()``: what a program learns about tools at run time."""

from __future__ import annotations

import json
import keyword
import re
from typing import Any

from tether._hostwork import checkpoint
from tether._tools.catalog import Catalog
from tether._tools.model import Tool
from tether._tools.params import parameters
from tether._tools.stubs import declaration
from tether.errors import InvalidArguments, UnknownTool

# One tool described by default fits this many bytes of JSON: five at once sit
# well inside a run's result limit, and a model reads the signature, not pages
# of response fields.
DEFAULT_BYTES = 2048
# detail="full" stays well inside a run's 30 KB result limit: a bigger entry
# (OpenAI's chat completions: 44 KB) leaves whole sections out, and each is
# asked for alone, in pages of this size, instead of being cut mid-JSON.
FULL_BYTES = 16_000
# The description's head is what says what a tool does; the rest is fine print.
_DESCRIPTION_CHARS = 320
SECTIONS = ("input_schema", "types", "description")
DETAILS = ("default", "full", *SECTIONS)


def describe(
    catalog: Catalog, address_or_list: str | list[str] | tuple[str, ...], detail: str = "default", offset: int = 0,
    *, whole: bool = False,
) -> list[dict[str, Any]]:
    """Describe one tool or several, in the order asked.

    Each entry is ``{"address", "signature", "types", "description",
    "annotations"}``, signature first: ``signature`` is the Python
    declaration a call is checked against and ``types`` the shapes it
    mentions (``TypedDict`` classes named from the schema, nearest first).
    By default an entry is at most ``DEFAULT_BYTES`` of JSON: shapes that do
    not fit and the description's tail are left out and ``note`` says what
    and how to see it. ``detail="full"`` gives every shape, the whole
    description and the ``input_schema`` within ``FULL_BYTES``; sections
    that do not fit are left out, largest first, and ``note`` names them.
    ``detail="input_schema" | "types" | "description"`` gives that section
    alone, a page from ``offset`` (properties, shapes or characters) at a
    time, with ``next_offset`` while more is left. ``whole=True`` (the CLI's
    ``--full``, which has no result limit) gives ``detail="full"`` unbounded. An unknown address gives
    ``{"address", "error": "unknown_tool", "suggestions"}`` instead of
    raising, so a list can partly succeed.
    """
    if detail not in DETAILS:
        raise InvalidArguments(
            f"describe: detail must be one of {', '.join(map(repr, DETAILS))}, got {detail!r}",
            next_action="Call describe(address) or describe(address, detail='full').",
        )
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidArguments(f"describe: offset must be a whole number >= 0, got {offset!r}",
                               next_action="Pass the next_offset an earlier describe() returned.")
    addresses = [address_or_list] if isinstance(address_or_list, str) else list(address_or_list)
    cache: dict[tuple[str, str], dict[str, Any]] = catalog.memo("describe", dict)
    out: list[dict[str, Any]] = []
    for address in addresses:
        checkpoint()  # many addresses (each unknown one is compared with the whole catalog) take long
        if not isinstance(address, str):
            out.append({"address": repr(address), "error": "unknown_tool", "suggestions": []})
            continue
        try:
            tool = catalog.get(address)
        except UnknownTool as exc:
            out.append({"address": address, "error": exc.code, "suggestions": exc.details.get("suggestions", [])})
            continue
        if detail in SECTIONS:
            out.append(_section(tool, detail, offset))
            continue
        key = (tool.address, detail + (":whole" if whole else ""))
        entry = cache.get(key)
        if entry is None:
            entry = cache[key] = _full(tool, whole) if detail == "full" else _bounded(tool)
        out.append(dict(entry))
    return out


def _full(tool: Tool, whole: bool = False) -> dict[str, Any]:
    signature, shapes = declaration(tool)
    entry = {
        "address": tool.address,
        "signature": signature,
        **_parameters(tool),
        "types": "\n\n".join(text for _, text in shapes),
        "description": tool.description,
        "annotations": tool.annotations.to_dict(),
        **_undo(tool),
        "input_schema": tool.input_schema,
    }
    left_out: list[str] = []
    for name in [] if whole else sorted(SECTIONS, key=lambda n: -_size(entry[n])):
        if _size(entry) + _NOTE_BYTES <= FULL_BYTES:
            break
        del entry[name]
        left_out.append(name)
    if left_out:
        asks = ", ".join(f"describe({tool.address!r}, detail={n!r})" for n in left_out)
        entry["note"] = f"too large to show whole; left out: {', '.join(left_out)}. Each alone, in pages: {asks}"
    return entry


def _section(tool: Tool, name: str, offset: int) -> dict[str, Any]:
    """One section of a tool's description, a page from ``offset`` at a time."""
    page: Any
    if name == "input_schema":
        props = list((tool.input_schema.get("properties") or {}).items())
        chosen: dict[str, Any] = {}
        end = offset
        for prop, schema in props[offset:]:
            if chosen and _size(chosen) + _size({prop: schema}) > FULL_BYTES:
                break
            chosen[prop] = schema
            end += 1
        required = [r for r in tool.input_schema.get("required") or [] if r in chosen]
        page, total = {**tool.input_schema, "properties": chosen, "required": required}, len(props)
    elif name == "types":
        shapes = [text for _, text in declaration(tool)[1]]
        kept: list[str] = []
        end = offset
        for text in shapes[offset:]:
            if kept and _size(kept) + _size(text) > FULL_BYTES:
                break
            kept.append(text)
            end += 1
        page, total = "\n\n".join(kept), len(shapes)
    else:
        text = tool.description or ""
        end = min(len(text), offset + FULL_BYTES // 2)  # characters: JSON escapes can double a few
        page, total = text[offset:end], len(text)
    return {"address": tool.address, "section": name, name: page, "offset": offset,
            "next_offset": end if end < total else None}


def _undo(tool: Tool) -> dict[str, Any]:
    """Whether a write of the tool can be undone, and by what (P-46)."""
    return {"undo": tool.undo.shown()} if tool.undo is not None else {}


def _bounded(tool: Tool) -> dict[str, Any]:
    """The default entry: signature, then shapes nearest first while they fit."""
    signature, shapes = declaration(tool)
    description = _clip(tool.description or "", _DESCRIPTION_CHARS)
    cut_description = description != (tool.description or "").strip()
    entry: dict[str, Any] = {"address": tool.address, "signature": signature, **_parameters(tool), "types": "",
                             "description": description, "annotations": tool.annotations.to_dict(),
                             **_undo(tool)}
    schema_cut = False
    if "parameters" in entry:
        # The signature cannot name these parameters: the schema is how their types are seen.
        if _size(tool.input_schema) <= DEFAULT_BYTES // 2:
            entry["input_schema"] = tool.input_schema
        else:
            schema_cut = True
    # A signature past the budget (dozens of enum values) lists a few of each long Literal.
    entry["signature"], shortened = _shorten_literals(signature, DEFAULT_BYTES - _size(entry) + _size(signature)
                                                      - _NOTE_BYTES)
    reserve = _NOTE_BYTES
    while True:
        room = DEFAULT_BYTES - _size(entry) - reserve
        shown: list[str] = []
        partial_name = ""
        for name, text in shapes:
            cost = _size(text) - 2 + (len("\\n\\n") if shown else 0)
            if cost <= room:
                shown.append(text)
                room -= cost
                continue
            if room > 0:
                # The nearest shape that does not fit whole: show its head.
                partial = _head_of_class(text, room)
                if partial:
                    shown.append(partial)
                    partial_name = name
            break
        bounded = {**entry, "types": "\n\n".join(shown)}
        missing = [name for name, text in shapes if text not in shown and name != partial_name]
        if missing or partial_name or cut_description or shortened or schema_cut:
            bounded["note"] = _note(tool.address, missing, len(shapes), cut_description, shortened, partial_name,
                                    schema_cut)
        over = _size(bounded) - DEFAULT_BYTES
        if over > 0 and not shown:
            return _fit_description(bounded, tool, over)
        if over <= 0:
            return bounded
        reserve += over


def _fit_description(entry: dict[str, Any], tool: Tool, over: int) -> dict[str, Any]:
    """An entry whose signature leaves no room for shapes: the description gives way, down to nothing.

    The signature is what a call is checked against, so it is never cut past
    its Literal lists; when it alone is over the budget the entry is too, and
    the note says so.
    """
    description = entry["description"]
    keep = len(description) - over - len(" …")
    fitted = {**entry, "description": _clip(description, keep) if keep > 40 else "",
              "note": f"a long signature leaves no room for shapes or the whole description: "
                      f"describe({tool.address!r}, detail='full') shows everything"}
    if _size(fitted) > DEFAULT_BYTES:
        fitted["note"] = _SIGNATURE_NOTE.format(address=tool.address)
    return fitted


_SIGNATURE_NOTE = ("the signature alone is over the default size and is shown whole: "
                   "describe({address!r}, detail='full') shows its shapes and description")


def _parameters(tool: Tool) -> dict[str, str]:
    """For a tool with a parameter a Python call cannot name (``from``, ``user-id``), how to pass each.

    Its signature is then ``(*args, **kwargs)`` (see stubs), which shows
    neither the names nor the order positional arguments fill.
    """
    props = tool.input_schema.get("properties") or {}
    if all(name.isidentifier() and not keyword.iskeyword(name) for name in props):
        return {}
    params = parameters(tool)

    def one(name: str) -> str:
        return json.dumps(name, ensure_ascii=False) + ("" if name in params.required else " (optional)")

    text = "by position in this order, or by name as **{\"name\": value}: " + ", ".join(map(one, params.positional))
    if params.keyword_only:
        text += "; by name only: " + ", ".join(map(one, params.keyword_only))
    return {"parameters": text}


_LITERAL = re.compile(r"Literal\[((?:\"(?:[^\"\\]|\\.)*\"|[^\]\"])*)\]")
_MEMBER = re.compile(r"\"(?:[^\"\\]|\\.)*\"|[^,\s][^,]*")
_KEEP_MEMBERS = 4


def _shorten_literals(signature: str, room: int) -> tuple[str, bool]:
    """Cut the longest ``Literal[...]`` lists to a few values and ``...`` until the signature fits ``room``.

    Each list is cut at most once, longest first, so the work is one pass over
    the signature whatever it holds: a signature still over ``room`` once every
    long list is cut (a union of dozens of shapes) is returned as it then is.
    """
    size = _size(signature)
    if size <= room:
        return signature, False
    cuts: list[tuple[int, int, str]] = []
    for m in sorted(_LITERAL.finditer(signature), key=lambda m: len(m.group(0)), reverse=True):
        members = _MEMBER.findall(m.group(1))
        if len(members) <= _KEEP_MEMBERS + 1:
            # Four values and "..." is as short as a list gets; cutting it again would change nothing.
            continue
        short = "Literal[" + ", ".join([*members[:_KEEP_MEMBERS], "..."]) + "]"
        cuts.append((m.start(), m.end(), short))
        # JSON escapes each character on its own, so a cut's saving adds up.
        size -= _size(m.group(0)) - _size(short)
        if size <= room:
            break
    if not cuts:
        return signature, False
    pieces: list[str] = []
    at = 0
    for start, end, short in sorted(cuts):
        pieces += [signature[at:start], short]
        at = end
    pieces.append(signature[at:])
    return "".join(pieces), True


_NOTE_BYTES = 240


def _note(address: str, missing: list[str], total: int, cut_description: bool, shortened: bool, partial: str,
          schema_cut: bool = False) -> str:
    parts = []
    if schema_cut:
        parts.append("the input schema is left out")
    if shortened:
        parts.append("long Literal lists end in ...")
    if partial:
        parts.append(f"{partial} is cut")
    if missing:
        names = ", ".join(missing[:4]) + (", …" if len(missing) > 4 else "")
        parts.append(f"{len(missing)} of {total} shapes not shown ({names})")
    if cut_description:
        parts.append("the description is cut")
    text = "; ".join(parts) or "a shape is cut"
    note = f"{text}: describe({address!r}, detail='full') shows everything"
    if _size(note) > _NOTE_BYTES:
        note = f"some shapes and text not shown: describe({address!r}, detail='full') shows everything"
    return note


def _head_of_class(text: str, room: int) -> str:
    """The first lines of a class that fit ``room`` bytes, with a line saying how many are left."""
    lines = text.split("\n")
    kept: list[str] = []
    for i, line in enumerate(lines):
        tail = f"    # … {len(lines) - i} more fields"
        if _size("\n".join([*kept, line, tail])) > room:
            if len(kept) <= 1:
                return ""
            return "\n".join([*kept, f"    # … {len(lines) - i} more fields"])
        kept.append(line)
    return "\n".join(kept)


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[:limit]
    # End on a sentence if one ends in the second half, else on a word.
    stop = cut.rfind(". ")
    if stop > limit // 2:
        return cut[: stop + 1] + " …"
    return cut.rsplit(" ", 1)[0] + " …"


def list_sources(catalog: Catalog) -> list[dict[str, Any]]:
    """``[{"namespace", "tools": count, "summary"}]`` for every namespace, sorted."""
    return [dict(entry) for entry in catalog.namespaces()]

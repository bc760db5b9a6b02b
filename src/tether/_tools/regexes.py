"""A tool schema's regexes, matched against what a program passes, cannot hold the host.

Python's regex engine backtracks holding the GIL: a tool description's
``^(a+)+$`` against 40 ``a`` and a ``!`` from the program takes hours on the
loop. The regexes come from the description (``pattern``, the keys of
``patternProperties``), the strings from the program (values, and the names of
an object's keys). A regex that can backtrack exponentially (a repeat inside a
repeat, an alternation under one, a backreference) is not matched here — the
tool's own validation still applies — and a long string is matched only
against regexes linear in it.

What that leaves unchecked, where a regex is not matched:

- ``pattern``: the value passes.
- ``patternProperties``: the keys are not checked against that regex's schema.
- ``additionalProperties``: a key counts as matched by that regex, so it is
  not refused as unknown.
- ``unevaluatedProperties``: not checked at all for a schema that has such a
  regex anywhere (it collects keys through every subschema, ``$ref`` included).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterator

import jsonschema

# A string this long is matched only against a regex with at most one unbounded repeat: two in a row
# (``a*a*$``) already take time quadratic in its length.
LONG_MATCH = 10_000


@functools.lru_cache(maxsize=1024)
def backtracking(regex: str) -> int | None:
    """How many long repeats ``regex`` has, or None if it can backtrack exponentially (or is not valid)."""
    try:
        parsed = re._parser.parse(regex)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an invalid pattern is the schema's problem, not a check to run
        return None
    count = 0

    def walk(items: Any, under: bool) -> bool:
        nonlocal count
        for op, av in items:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                # A repeat of a few (\d{1,3}, (...){3}) backtracks a bounded amount, even nested.
                nests = av[1] > 8
                if nests and under:
                    return True
                count += av[1] > 64
                if walk(av[2], under or nests):
                    return True
            elif name == "BRANCH":
                if under or any(walk(b, under) for b in av[1]):
                    return True
            elif name in ("GROUPREF", "GROUPREF_EXISTS"):
                return True
            elif name == "SUBPATTERN":
                if walk(av[-1], under):
                    return True
            elif name in ("ASSERT", "ASSERT_NOT", "ATOMIC_GROUP") and walk(av[-1], under):
                return True
        return False

    return None if walk(parsed, False) else count


def safe_to_match(regex: Any, text: Any) -> bool:
    """Whether matching ``regex`` against ``text`` is bounded: linear in the text, or the text is short."""
    if not isinstance(regex, str) or not isinstance(text, str):
        return True  # not a regex match at all: the keyword's own code decides
    repeats = backtracking(regex)
    return repeats is not None and (repeats <= 1 or len(text) <= LONG_MATCH)


def _key_regexes(schema: Any) -> Iterator[str]:
    """Every ``patternProperties`` regex anywhere in a schema."""
    if isinstance(schema, dict):
        found = schema.get("patternProperties")
        if isinstance(found, dict):
            yield from (k for k in found if isinstance(k, str))
        for value in schema.values():
            yield from _key_regexes(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _key_regexes(value)


def bounded(cls: Any, schema: Any) -> Any:
    """``cls`` (a jsonschema validator class) whose regex checks for ``schema`` cannot hold the host."""
    regexes = set(_key_regexes(schema))
    # Exponential anywhere, or quadratic on a long key: unevaluatedProperties runs them all.
    worst = 2 if any(backtracking(r) is None for r in regexes) else \
        1 if any((backtracking(r) or 0) > 1 for r in regexes) else 0
    key = (cls, worst)
    out = _BOUNDED.get(key)
    if out is None:
        out = _BOUNDED[key] = jsonschema.validators.extend(cls, _keywords(cls, worst))  # type: ignore[no-untyped-call]
    return out


_BOUNDED: dict[Any, Any] = {}


def _keywords(cls: Any, worst: int) -> dict[str, Any]:
    given = cls.VALIDATORS
    out: dict[str, Any] = {}
    pattern, by_key = given.get("pattern"), given.get("patternProperties")
    additional, unevaluated = given.get("additionalProperties"), given.get("unevaluatedProperties")

    if pattern is not None:
        def checked_pattern(validator: Any, regex: Any, instance: Any, schema: Any) -> Any:
            if safe_to_match(regex, instance):
                yield from pattern(validator, regex, instance, schema) or ()
        out["pattern"] = checked_pattern

    if by_key is not None:
        def checked_by_key(validator: Any, regexes: Any, instance: Any, schema: Any) -> Any:
            if isinstance(regexes, dict) and isinstance(instance, dict):
                # Each key is matched only against the regexes bounded for it.
                for regex, subschema in regexes.items():
                    for k, v in instance.items():
                        if safe_to_match(regex, k) and re.search(regex, k):
                            yield from validator.descend(v, subschema, path=k, schema_path=regex)
                return
            yield from by_key(validator, regexes, instance, schema) or ()
        out["patternProperties"] = checked_by_key

    if additional is not None:
        def checked_additional(validator: Any, allowed: Any, instance: Any, schema: Any) -> Any:
            regexes = schema.get("patternProperties") if isinstance(schema, dict) else None
            if isinstance(regexes, dict) and isinstance(instance, dict):
                unsafe = [r for r in regexes if any(not safe_to_match(r, k) for k in instance)]
                if unsafe:
                    # A regex not matched here matches every key (the empty regex): none is refused for it.
                    kept = {r: s for r, s in regexes.items() if r not in unsafe}
                    schema = {**schema, "patternProperties": {**kept, "": {}}}
            yield from additional(validator, allowed, instance, schema) or ()
        out["additionalProperties"] = checked_additional

    if unevaluated is not None and worst:
        def checked_unevaluated(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            if worst == 2 or (isinstance(instance, dict) and any(len(str(k)) > LONG_MATCH for k in instance)):
                return
            yield from unevaluated(validator, value, instance, schema) or ()
        out["unevaluatedProperties"] = checked_unevaluated
    return out

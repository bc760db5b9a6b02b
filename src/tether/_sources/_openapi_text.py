"""An OpenAPI description's text to a document: UTF-8, then JSON, else YAML (libyaml when PyYAML has it).

Kept apart from the source so the parser can be reasoned about alone: it runs on
the host-work threads (``hostwork.in_thread``) and must end on every input,
including YAML whose aliases nest ("billion laughs").
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from tether.errors import ConfigError

__all__ = ["decode_spec", "parse_spec"]


def decode_spec(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_spec(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as json_error:
        if importlib.util.find_spec("yaml") is None:
            if text.lstrip().startswith(("{", "[")):
                raise ConfigError(f"{where} is not valid JSON: {json_error}") from None
            raise ConfigError(
                f"{where} is not JSON, and YAML specs need PyYAML, which is not installed",
                next_action="Install pyyaml, or convert the spec to JSON.",
            ) from None
    import yaml

    # libyaml, when PyYAML was built with it, parses OpenAI's 3 MB YAML ~5x faster.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader, C or pure Python
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is neither valid JSON nor valid YAML: {exc}") from None
    return _string_keys(doc, {})


def _string_keys(node: Any, done: dict[int, Any]) -> Any:
    # YAML reads `200:` as an int; OpenAPI keys are strings. A node reached
    # again through a YAML alias is converted once: aliases nest, and copying
    # each would take time exponential in the nesting ("billion laughs").
    if not isinstance(node, (dict, list)):
        return node
    if id(node) in done:
        return done[id(node)]
    if isinstance(node, dict):
        mapping: dict[str, Any] = {}
        done[id(node)] = mapping
        mapping.update((str(k), _string_keys(v, done)) for k, v in node.items())
        return mapping
    items: list[Any] = []
    done[id(node)] = items
    items.extend(_string_keys(v, done) for v in node)
    return items

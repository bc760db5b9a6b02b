"""An OpenAPI source's credentials: where its ``auth`` config says they go, read from the environment at call time.

They are never part of a tool's schema, and the parameters a spec declares for them are dropped (``covers``),
so a program can neither see nor override them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.errors import ConfigError


@dataclass(frozen=True)
class Auth:
    kind: str  # bearer | header | query
    name: str  # header or query parameter name
    env: str

    @classmethod
    def parse(cls, raw: Mapping[str, Any], namespace: str) -> Auth:
        kind = raw.get("type")
        where = f"auth of OpenAPI source {namespace!r}"
        if kind == "bearer" and isinstance(raw.get("token_env"), str):
            return cls("bearer", "Authorization", raw["token_env"])
        if kind in ("header", "query") and isinstance(raw.get("name"), str) and isinstance(raw.get("value_env"), str):
            return cls(kind, raw["name"], raw["value_env"])
        raise ConfigError(
            f"{where}: expected {{'type': 'bearer', 'token_env': ...}}, "
            f"{{'type': 'header', 'name': ..., 'value_env': ...}} or "
            f"{{'type': 'query', 'name': ..., 'value_env': ...}}, got keys {sorted(raw)}"
        )

    def value(self) -> str:
        found = os.environ.get(self.env)
        if not found:
            raise ConfigError(
                f"the auth environment variable {self.env} is not set",
                next_action=f"Set {self.env} in tether's environment.",
            )
        return f"Bearer {found}" if self.kind == "bearer" else found

    def covers(self, location: str, name: str) -> bool:
        if self.kind == "query":
            return location == "query" and name == self.name
        return location == "header" and name.lower() == self.name.lower()

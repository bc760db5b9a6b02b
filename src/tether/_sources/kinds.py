"""The source kinds: for each ``type`` of a ``[[sources]]`` table, its table, how it is built, what it can do.

A kind is one registration here: :class:`SourceKind` names the table's model (checked when tether.toml is
read, and by ``Config``'s union of every registered kind), the function that builds the running source from
a recorded definition (imported only when a source of that kind is loaded, so reading a config never pulls
in an MCP client stack), and its capabilities:

- ``caches_listing``: its tool listing is kept, signed, in the store, and the source starts at the first
  call of one of its tools (the listing is an MCP server's tools/list answer: tether._sources._mcp_tools);
- ``asks_questions``: a call may put a question to the run's user mid-call (it is given an elicitation
  handler, tether._engine.attempt.questions).

Adding a kind (docs/architecture.md, "Adding a source kind"): its module under ``_sources/`` implements the
Source protocol (base.py) and a ``from_definition(definition, context)``; its table's model and one
``register(...)`` go here. Nothing else names a kind: the loader and the config ask this registry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, Union
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tether._fields import EnvName, Expected, HttpUrl, Identifier, Seconds, StrList, StrTable, Text
from tether.errors import ConfigError

if TYPE_CHECKING:
    from tether._sources.base import Source

__all__ = ["DEFAULT_START_TIMEOUT", "KINDS", "SourceContext", "SourceDefinition", "SourceKind", "kind_of",
           "register"]

# A source that has not started in 10 s is hung or misconfigured; a cold
# `uvx`/`npx` download can take longer, and may raise it per source.
DEFAULT_START_TIMEOUT = 10.0

# "key": the source's tools dedupe by idempotency key, so a write whose outcome
# was lost is re-sent with the same key (P-31). "none" never re-sends.
Idempotency = Literal["none", "key"]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Where a source's results come from, for a write guarded by lineage (P-45, D-64): "untrusted" results may hold
# text someone other than the user wrote (mail, files, web pages, chat); "trusted" ones only what the user or
# the operator put there. Without a label every tool of a source is untrusted (docs/security.md).
Trust = Annotated[Literal["trusted", "untrusted"], Expected('must be "trusted" or "untrusted"')]
TrustTable = Annotated[dict[str, Trust], Expected('must be a table of "trusted" / "untrusted"')]
RoleTable = Annotated[dict[str, Literal["destination", "content"]],
                      Expected('must be a table of "<tool>.<argument>" = "destination" / "content"')]


class _Definition(_Table):
    # The label of every tool of the source; per tool (`trust_tools`, by tool name) and per field of a tool's
    # result (`trust_fields`, "<tool>.<field>[.<field>...]") it can be changed. None: not recorded with a run.
    trust: Trust | None = None
    trust_tools: TrustTable | None = None
    trust_fields: TrustTable | None = None
    # Which arguments of a tool are destinations (a recipient, an account) or content, where their names and
    # schemas do not say (tether._engine.lineage.roles): "<tool>.<argument>" = "destination" | "content".
    roles: RoleTable | None = None

    def resolved(self, base: Path) -> _Definition:
        """The definition with the paths it holds made absolute against ``base`` (the config file's folder)."""
        return self


class UndoTable(_Table):
    """``[sources.undo.<tool>]``: the tool that undoes a call of ``<tool>``, and how each of its arguments
    follows from the call (``"args.<key>"``, ``"result.<key>"``, or a literal) (P-46)."""

    tool: Text
    args: dict[str, Any] | None = None


# Undo declarations by the name of the tool (in the source's namespace) they undo.
Undos = dict[str, UndoTable]


def _path_against(value: str, base: Path) -> str:
    # Paths in the file are relative to the file, not to wherever tether runs.
    return str((base / value).resolve())


# --- python ---------------------------------------------------------------------------


class PythonSourceDefinition(_Definition):
    type: Literal["python"]
    # A dotted module name or a path to a .py file (relative to the config file).
    module: Text
    # Defaults to the module's TETHER_NAMESPACE.
    namespace: Identifier | None = None
    # "key" marks every write tool of the module; @tool(idempotent_with_key=True) marks one.
    idempotency: Idempotency = "none"

    def resolved(self, base: Path) -> PythonSourceDefinition:
        if self.module.endswith(".py") or "/" in self.module:
            return self.model_copy(update={"module": _path_against(self.module, base)})
        return self


# --- mcp ------------------------------------------------------------------------------


class MCPSourceDefinition(_Definition):
    type: Literal["mcp"]
    namespace: Identifier
    command: StrList | None = None
    url: HttpUrl | None = None
    env: StrTable = Field(default_factory=dict)
    headers: StrTable = Field(default_factory=dict)
    cwd: Text | None = None
    idempotency: Idempotency = "none"
    undo: Undos = Field(default_factory=dict)
    start_timeout: Seconds = DEFAULT_START_TIMEOUT
    # Without progress, a call may take this long (default: [limits] call_timeout_seconds);
    # each progress notification from the server restarts it ...
    call_timeout: Seconds | None = None
    # ... up to this many seconds in all (default: call_timeout, i.e. progress does not extend it).
    max_call_seconds: Seconds | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> MCPSourceDefinition:
        if (self.command is None) == (self.url is None):
            raise PydanticCustomError(
                "tether", "set exactly one of 'command' (a stdio server) or 'url' (an HTTP server)"
            )
        if self.url is not None and (self.env or self.cwd is not None):
            raise PydanticCustomError("tether", "'env' and 'cwd' apply only to a 'command' server")
        if self.command is not None and self.headers:
            raise PydanticCustomError("tether", "'headers' apply only to a 'url' server")
        return self

    def resolved(self, base: Path) -> MCPSourceDefinition:
        return self if self.cwd is None else self.model_copy(update={"cwd": _path_against(self.cwd, base)})


# --- openapi --------------------------------------------------------------------------


class SourceBearerAuth(_Table):
    type: Literal["bearer"]
    token_env: EnvName


class SourceHeaderAuth(_Table):
    type: Literal["header"]
    name: Text
    value_env: EnvName


class SourceQueryAuth(_Table):
    type: Literal["query"]
    name: Text
    value_env: EnvName


SourceAuth = Annotated[SourceBearerAuth | SourceHeaderAuth | SourceQueryAuth, Field(discriminator="type")]


class OpenAPISourceDefinition(_Definition):
    type: Literal["openapi"]
    namespace: Identifier
    # A path (relative to the config file) or an http(s) URL.
    spec: Text
    base_url: HttpUrl | None = None
    auth: SourceAuth | None = None
    headers: StrTable = Field(default_factory=dict)
    idempotency: Idempotency = "none"
    # The header that carries the key on non-safe requests; false sends none.
    idempotency_header: Annotated[
        Text | Literal[False], Expected("must be a header name, or false to send no key")
    ] = "Idempotency-Key"
    start_timeout: Seconds = DEFAULT_START_TIMEOUT
    call_timeout: Seconds | None = None
    # How a call is undone (P-46), by tool name; a POST that creates is paired with the DELETE of what it
    # returned unless this names another undo, or false for none.
    undo: dict[str, UndoTable | Literal[False]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _key_needs_header(self) -> OpenAPISourceDefinition:
        if self.idempotency == "key" and self.idempotency_header is False:
            raise PydanticCustomError(
                "tether", "idempotency = \"key\" needs idempotency_header: the API must receive the key"
            )
        return self

    def resolved(self, base: Path) -> OpenAPISourceDefinition:
        if urlsplit(self.spec).scheme in ("http", "https"):
            return self
        return self.model_copy(update={"spec": _path_against(self.spec, base)})


# --- the registry ---------------------------------------------------------------------


@dataclass(frozen=True)
class SourceContext:
    """What the process loading a source gives its builder (tether._sources.loader.SourceSet)."""

    timeout: float  # the definition's start_timeout, in seconds
    # The store's signed cache of compiled catalogs (an OpenAPI spec compiled once), or None.
    catalogs: Any = None
    # A log file for a stdio server's stderr, by namespace; None where the process keeps none.
    errlog: Callable[[str], Any] = lambda namespace: None
    default_call_timeout: float | None = None  # [limits] call_timeout_seconds
    # For a kind that asks questions: the handler that puts one to the run's user, by namespace.
    ask: Callable[[str], Any] | None = None
    progress: Callable[[Any], None] | None = None  # upstream progress, for the run's observers


@dataclass(frozen=True)
class SourceKind:
    name: str  # the table's ``type`` key
    definition: type[_Definition]  # the table's model
    builder: str  # "module:function" of ``from_definition(definition, context) -> Source``, imported on use
    # What a person deciding a write reads for where it goes, when the definition has a url or a command.
    title: str = ""
    caches_listing: bool = False
    asks_questions: bool = False

    def build(self, definition: dict[str, Any], context: SourceContext) -> Source:
        """The source ``definition`` names, not started yet."""
        module, function = self.builder.split(":")
        build: Callable[[dict[str, Any], SourceContext], Source] = getattr(importlib.import_module(module), function)
        return build(definition, context)


KINDS: dict[str, SourceKind] = {}


def register(kind: SourceKind) -> SourceKind:
    if kind.name in KINDS:
        raise ValueError(f"source kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def kind_of(type_: object) -> SourceKind:
    """The registered kind of a definition's ``type``; ConfigError for one this tether does not know."""
    kind = KINDS.get(type_) if isinstance(type_, str) else None
    if kind is None:
        raise ConfigError(f"unknown source type {type_!r} (this tether knows {', '.join(sorted(KINDS))})")
    return kind


register(SourceKind("python", PythonSourceDefinition, "tether._sources.python:from_definition"))
register(SourceKind("mcp", MCPSourceDefinition, "tether._sources.mcp:from_definition", title="MCP server",
                    caches_listing=True, asks_questions=True))
register(SourceKind("openapi", OpenAPISourceDefinition, "tether._sources.openapi:from_definition"))

# A [[sources]] table: one of the registered kinds' tables, told apart by ``type``.
if TYPE_CHECKING:
    SourceDefinition = _Definition
else:
    SourceDefinition = Annotated[Union[tuple(k.definition for k in KINDS.values())],  # noqa: UP007
                                 Field(discriminator="type")]

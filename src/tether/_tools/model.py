"""The tool model: what a tool is, independent of where it comes from."""

from __future__ import annotations

import functools
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from tether._tools.undo import Undo
from tether.errors import InvalidToolDefinition

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# A tool's handler receives the validated arguments as one keyword dict (a
# positional call is bound to names first, see tools.binding) and
# returns a JSON-compatible value (or raises). Sources build handlers; the
# effect boundary is the only caller.
Handler = Callable[[dict[str, Any]], Awaitable[Any]]

# What a tool promises about its idempotency key (P-25, P-31): "none", or
# "key" when the callee dedupes by the key, so tether may re-send a write
# whose outcome it lost with the same key.
IDEMPOTENCY_MODES = ("none", "key")


@dataclass(frozen=True)
class Annotations:
    """Hints with the meaning of MCP tool annotations.

    ``read_only`` is what the policy reads: a tool not marked read-only is a
    write, so an unannotated tool is governed like a write.
    """

    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False

    def to_dict(self) -> dict[str, bool]:
        return {
            "read_only": self.read_only,
            "destructive": self.destructive,
            "idempotent": self.idempotent,
            "open_world": self.open_world,
        }


def check_identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENT.match(value):
        raise InvalidToolDefinition(
            f"{what} {value!r} is not a valid Python identifier",
            next_action=f"Name the {what} with letters, digits and underscores, not starting with a digit.",
        )
    return value


def split_address(address: str) -> tuple[str, str]:
    namespace, sep, name = address.partition(".")
    if not sep:
        raise InvalidToolDefinition(
            f"tool address {address!r} must be 'namespace.name'",
            next_action="Write the address as namespace.name.",
        )
    return namespace, name


@dataclass(frozen=True)
class Tool:
    """One callable tool, addressed ``namespace.name``."""

    namespace: str
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Handler = field(compare=False, repr=False)
    title: str | None = None
    output_schema: dict[str, Any] | None = None
    annotations: Annotations = Annotations()
    source: str = "python"
    # The handler checks its own arguments (raising InvalidArguments): the
    # boundary may then skip its JSON Schema check for reads, where a
    # malformed call costs nothing. Writes are always checked before policy.
    validates_args: bool = False
    # Parameters that may only be passed by keyword (a Python tool's ``*, x``);
    # the others may also be passed by position (see tools.binding).
    keyword_only: tuple[str, ...] = ()
    idempotency: str = "none"
    # How long the boundary lets one call take; None means [limits]
    # call_timeout_seconds. A source that bounds calls itself (an MCP server
    # sending progress) sets its own ceiling here.
    timeout_seconds: float | None = None
    # Where the output schema comes from when it is not in ``output_schema``:
    # a compiled OpenAPI catalog reads them only when a stub needs one
    # (GitHub's are 10 of its 12 MB, and most runs never look).
    output_schema_loader: Callable[[], dict[str, Any] | None] | None = field(default=None, compare=False, repr=False)
    # Where a call goes, for the people who approve it: an OpenAPI operation's
    # (HTTP method, URL template with its {path} parameters); None elsewhere.
    target: tuple[str, str] | None = None
    # How a write of this tool is undone (P-46): its compensation tool and how that tool's arguments follow
    # from this call's arguments and result; None when nothing declares one.
    undo: Undo | None = None
    # What this tool's results are worth to a write guarded by lineage (P-45, D-73): "trusted" or "untrusted"
    # (None: no label of its own), per field of its result ("<field>[.<field>...]": label), and which of its
    # arguments are destinations or content ("<argument>": "destination" | "content"). Merged with the labels of
    # a [[sources]] table for the same tool by tether._engine.lineage.trust.labels_from.
    trust: str | None = None
    trust_fields: Mapping[str, str] | None = None
    roles: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        check_identifier(self.namespace, "namespace")
        check_identifier(self.name, "tool name")
        if self.idempotency not in IDEMPOTENCY_MODES:
            raise InvalidToolDefinition(
                f"tool {self.address}: idempotency must be 'none' or 'key', not {self.idempotency!r}",
                next_action="Say 'key' only when the tool dedupes calls by their idempotency key.",
            )
        _check_object(self.address, self.input_schema)
        if self.trust is not None or self.trust_fields is not None or self.roles is not None:
            from tether._tools.trust import check_labels

            props = self.input_schema.get("properties")
            arguments = None if self.input_schema.get("additionalProperties") or not isinstance(props, dict) \
                else list(props)
            _, fields, roles = check_labels(self.address, self.trust, self.trust_fields, self.roles, arguments)
            # Copies: a mapping the caller changes later does not change what the guard reads.
            object.__setattr__(self, "trust_fields", fields)
            object.__setattr__(self, "roles", roles)

    @classmethod
    def deferred(cls, load: Callable[[], tuple[str, dict[str, Any]]], **values: Any) -> Tool:
        """A tool whose ``description`` and ``input_schema`` are read by ``load()`` when first asked for.

        For a source restoring a catalog it compiled and signed earlier (OpenAPI:
        GitHub's 1,223 tools): a trivial run reads only names, and decoding every
        schema at start was most of what four cached descriptions cost (D-47).
        The name checks of ``__init__`` ran when the catalog was compiled; the
        schema is checked when loaded. Every other field is given here, as to
        ``Tool(...)``.
        """
        tool = cls.__new__(cls)
        # Frozen: the fields go into __dict__ directly, as the generated __init__ would set them.
        tool.__dict__.update(_DEFAULTS, **values, _load=load)
        return tool

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any attribute of any Tool

        def __getattr__(self, name: str) -> Any:
            # Reached only for an attribute not in __dict__: a deferred tool's description or input schema.
            load = self.__dict__.get("_load") if name in _DEFERRED else None
            if load is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            description, schema = load()
            _check_object(f"{self.namespace}.{self.name}", schema)
            # Two threads may load at once (describe on the host-work threads): both get the same values.
            self.__dict__.update(description=description, input_schema=schema)
            return self.__dict__[name]

    @functools.cached_property
    def address(self) -> str:
        # Kept once made (in the instance's __dict__, beside the fields): read several times on every host call.
        return f"{self.namespace}.{self.name}"

    def returns_schema(self) -> dict[str, Any] | None:
        """The output schema, from ``output_schema`` or its loader."""
        if self.output_schema is not None or self.output_schema_loader is None:
            return self.output_schema
        return self.output_schema_loader()

    @property
    def is_write(self) -> bool:
        return not self.annotations.read_only

    @property
    def dedupes_by_key(self) -> bool:
        """The callee makes repeated sends with one idempotency key take effect once (P-31)."""
        return self.idempotency == "key"

    def summary(self) -> dict[str, Any]:
        """The JSON shape search results and `describe` share."""
        return {
            "address": self.address,
            "title": self.title,
            "description": self.description,
            "annotations": self.annotations.to_dict(),
            # Whether a write can be undone, and by what (P-46): shown with every write a person decides.
            **({"undo": self.undo.shown()} if self.undo is not None else {}),
        }


# What Tool.deferred leaves to its loader; both have no default, so a missing one reaches __getattr__.
_DEFERRED = frozenset({"description", "input_schema"})
# (No field has a default_factory: tests/sources/test_openapi_cache.py compares a deferred tool with a built one.)
_DEFAULTS = {f.name: f.default for f in fields(Tool) if f.default is not MISSING}


def _check_object(address: str, schema: dict[str, Any]) -> None:
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InvalidToolDefinition(
            f"tool {address}: input schema must describe an object",
            next_action="Give the tool keyword parameters.",
        )

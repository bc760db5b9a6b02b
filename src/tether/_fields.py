"""The checked value types a config key may hold, shared by the config and the engine's value objects.

``Limits`` and ``Policy`` (tether._engine) declare their fields with these types, so a ``[limits]`` or
``[policy]`` table parses straight into the object the engine runs with: one declaration of each field.
Scalars are strict (see below); each type carries the words an error message uses (``Expected``).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from typing import Annotated, Any, Callable
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, Strict
from pydantic_core import PydanticCustomError


class Expected:
    """What a key must hold, in the words an error message uses; a function gives words known only later
    (the store schemes that backends registered)."""

    def __init__(self, text: str | Callable[[], str]) -> None:
        self._text = text

    @property
    def text(self) -> str:
        return self._text if isinstance(self._text, str) else self._text()


# Scalars are strict so that TOML's `"5"` or `true` is an error rather than a
# silently coerced 5 or 1: a config typo should never change a limit.
PositiveInt = Annotated[int, Strict(), Field(gt=0), Expected("must be a positive integer")]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0), Expected("must be a non-negative integer")]
Seconds = Annotated[float, Strict(), Field(gt=0), Expected("must be a positive number of seconds")]
Bool = Annotated[bool, Strict(), Expected("must be true or false")]
Text = Annotated[str, Strict(), Field(min_length=1), Expected("must be a non-empty string")]
Days = Annotated[float, Strict(), Field(ge=0), Expected("must be a number of days, 0 to keep forever")]
Port = Annotated[
    int,
    Strict(),
    Field(ge=0, le=65535),
    Expected("must be a port number from 0 to 65535 (0 picks a free port)"),
]
StrTable = Annotated[dict[str, Annotated[str, Strict()]], Expected("must be a table of strings")]

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Custom checks raise with an empty message: the key's _Expected text says
# what was wrong, so the message is written once.
def _check_identifier(value: str) -> str:
    # ASCII and not a keyword: the namespace is written `tools.<namespace>`.
    if not IDENTIFIER.fullmatch(value) or keyword.iskeyword(value):
        raise PydanticCustomError("identifier", "")
    return value


def _check_env_name(value: str) -> str:
    if not IDENTIFIER.fullmatch(value):
        raise PydanticCustomError("env_name", "")
    return value


def _check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PydanticCustomError("http_url", "")
    return value


def _check_store_url(value: str) -> str:
    # Imported here: the registry is filled by the store package, which need not load to read this module.
    from tether._store import backend_for

    if backend_for(value) is None:
        raise PydanticCustomError("store_url", "")
    return value


def _expected_store_url() -> str:
    from tether._store import expected_url

    return expected_url()


def _check_glob(value: str) -> str:
    if value != "*" and "." not in value:
        raise PydanticCustomError("glob", "")
    return value


Identifier = Annotated[
    str,
    Strict(),
    AfterValidator(_check_identifier),
    Expected(
        "must be a Python identifier (ASCII letters, digits and underscores, not starting with a digit)"
    ),
]
EnvName = Annotated[
    str, Strict(), AfterValidator(_check_env_name), Expected("must be the name of an environment variable")
]
HttpUrl = Annotated[
    str, Strict(), AfterValidator(_check_http_url), Expected("must be an http:// or https:// URL")
]
StoreUrl = Annotated[
    str,
    Strict(),
    AfterValidator(_check_store_url),
    Expected(_expected_store_url),
]
Glob = Annotated[
    str,
    Strict(),
    AfterValidator(_check_glob),
    Expected("must be a 'namespace.tool' glob such as 'helpdesk.*', or '*'"),
]
# --- value objects checked like their table -------------------------------------------------------------
# Limits, Policy and Rule are plain frozen dataclasses whose fields are declared with the types above. The
# config's pydantic model parses a table straight into them (pydantic checks a stdlib dataclass by its field
# types, honouring its __pydantic_config__). Built in Python, each checks itself in __post_init__: by hand on
# the usual path (right types, in range: microseconds), and only when that fails by a pydantic dataclass
# twin, built on first need, which refuses the value with the error a table in tether.toml would get.
# Declaring them as pydantic dataclasses did the same but built three validators at every `import tether`
# (~11 ms of a cold `tether run`: sources_bench's no-source row; tests/shape/test_cold_imports.py).

_TWINS: dict[type, type] = {}


def _twin(cls: type) -> type:
    twin = _TWINS.get(cls)
    if twin is None:
        from pydantic.dataclasses import dataclass

        # A subclass: the class itself stays a plain dataclass. Its config is the class's __pydantic_config__.
        twin = _TWINS[cls] = dataclass(cls, frozen=True)
        twin.__tether_twin__ = True  # type: ignore[attr-defined]
    return twin


def recheck(value: Any) -> None:
    """Check ``value``'s fields as its table in tether.toml is checked, raising pydantic's ValidationError;
    what pydantic converts (a list of rule tables to a tuple of Rule) is stored back on ``value``."""
    cls = type(value)
    if getattr(cls, "__tether_twin__", False):
        return  # the twin's own __post_init__: pydantic has just checked these values
    names = [f.name for f in dataclasses.fields(cls)]
    checked = _twin(cls)(**{name: getattr(value, name) for name in names})
    for name in names:
        object.__setattr__(value, name, getattr(checked, name))


def checked_fields(cls: type) -> dict[str, Any]:
    """The pydantic FieldInfo of each field of such a class (for the config's error messages)."""
    return _twin(cls).__pydantic_fields__  # type: ignore[attr-defined]


def positive_int(value: Any) -> bool:
    """PositiveInt's hand check; anything it does not pass (a bool, a float, 0) goes to :func:`recheck`."""
    return type(value) is int and value > 0


def seconds(value: Any, name: str) -> bool:
    """Seconds' hand check of ``value.<name>``. An int is a number of seconds too, stored as a float as
    pydantic's strict float does (a run records its limits: 1 and 1.0 sign differently)."""
    number = getattr(value, name)
    if type(number) is int and number > 0:
        object.__setattr__(value, name, float(number))
        return True
    return type(number) is float and number > 0


StrList = Annotated[
    list[Annotated[str, Strict()]], Field(min_length=1), Expected("must be a non-empty list of strings")
]

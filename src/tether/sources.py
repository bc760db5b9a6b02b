"""Sources of tools: the interface a kind of source implements, and where a new kind registers.

A source is what a ``[[sources]]`` entry of ``tether.toml`` names (a Python
module, an MCP server, an OpenAPI document): the process loads it, and its
tools join the catalog under its namespace. :class:`Source` is the protocol
the loader drives every kind through; ``expand_env`` is the ``${VAR}``
expansion sources share for their env and headers. A new kind is one
:class:`SourceKind` given to :func:`register` (its ``[[sources]]`` table, the
builder the loader calls with a :class:`SourceContext`, its capabilities);
docs/architecture.md, "Adding a source kind".
"""

from tether._sources.base import Source, expand_env
from tether._sources.kinds import SourceContext, SourceKind, register

__all__ = ["Source", "SourceContext", "SourceKind", "expand_env", "register"]

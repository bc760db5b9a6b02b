"""Sources of tools: the interface a kind of source implements.

A source is what a ``[[sources]]`` entry of ``tether.toml`` names (a Python
module, an MCP server, an OpenAPI document): the process loads it, and its
tools join the catalog under its namespace. :class:`Source` is the protocol
the loader drives every kind through; ``expand_env`` is the ``${VAR}``
expansion sources share for their env and headers.
"""

from tether._sources.base import Source, expand_env

__all__ = ["Source", "expand_env"]

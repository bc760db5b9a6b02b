"""Tools: the model, the catalog, search, describe and stub generation."""

from .catalog import Catalog
from .describe import describe, list_sources
from .model import Annotations, Handler, Tool, split_address
from .prompt import model_description
from .search import SearchIndex, search
from .stubs import Stubs, ToolStub, build_stubs, render_signature

__all__ = [
    "Annotations",
    "Catalog",
    "Handler",
    "SearchIndex",
    "Stubs",
    "Tool",
    "ToolStub",
    "build_stubs",
    "describe",
    "list_sources",
    "model_description",
    "render_signature",
    "search",
    "split_address",
]

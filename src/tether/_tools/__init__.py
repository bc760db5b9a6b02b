"""Tools: the model, the catalog, search, describe and stub generation."""

from tether._tools.catalog import Catalog
from tether._tools.describe import describe, list_sources
from tether._tools.model import Annotations, Handler, Tool, split_address
from tether._tools.prompt import model_description
from tether._tools.search import SearchIndex, search
from tether._tools.stubs import Stubs, ToolStub, build_stubs, render_signature

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

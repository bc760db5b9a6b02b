"""Tools: the model, the catalog, search, describe and stub generation."""

from .model import Annotations, Handler, Tool, split_address

__all__ = ["Annotations", "Handler", "Tool", "split_address"]

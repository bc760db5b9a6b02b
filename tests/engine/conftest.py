"""What the engine's stream tests share: both settings of streamed calls, and both store backends."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import StoreBackend, each_store_backend, store_backend_params


@pytest.fixture(params=[True, False], ids=["streamed", "suspended"])
def stream(request: Any) -> bool:
    """pydantic-monty's stream_async_calls on and off (D-80)."""
    return bool(request.param)


@pytest.fixture(params=store_backend_params())
def backend(request, tmp_path, monkeypatch):
    yield from each_store_backend(request, tmp_path, monkeypatch, StoreBackend)

"""Fixtures the MCP server tests share: the help desk tools that record each delivery, and a runtime over them."""

from __future__ import annotations

import pytest

from helpers import Recorder
from tether._engine.rules.limits import Limits
from tether._runtime import Runtime


@pytest.fixture
def rec():
    return Recorder()


@pytest.fixture
async def rt(rec):
    async with Runtime(tools=rec.tools(), type_check=False,
                       limits=Limits(run_seconds=10, call_timeout_seconds=5)) as runtime:
        yield runtime

"""Idempotency keys: derived per call, recorded, passed to every kind of tool (P-25)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Clock, KeyedApi
from tether import CallContext, current_call, tool
from tether.runs.policy import Policy
from tether.runs.runtime import Runtime
from tether.sources.mcp import MCPSource
from tether.sources.openapi import OpenAPISource
from tether.store import open_store
from tether.tools.model import Annotations, Tool

FIXTURES = Path(__file__).parent / "fixtures"

ID_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}

PROGRAM = """
import tools
a = await tools.shop.get_item(id=1)
r = await tools.shop.charge(id=a["id"])
r
"""


class Seen:
    """Tools that note the call context each call was served with."""

    def __init__(self) -> None:
        self.contexts: list[CallContext | None] = []
        self.charged: dict[int, CallContext | None] = {}

    def tools(self) -> list[Tool]:
        async def get_item(args: dict) -> Any:
            self.contexts.append(current_call())
            return {"id": args["id"]}

        async def charge(args: dict) -> Any:
            self.contexts.append(current_call())
            self.charged[args["id"]] = current_call()
            return {"charged": args["id"]}

        return [
            Tool("shop", "get_item", "Read an item.", ID_SCHEMA, get_item, annotations=Annotations(read_only=True)),
            Tool("shop", "charge", "Charge (a write).", ID_SCHEMA, charge),
        ]


def runtime(store_url: str, seen: Seen, **kw) -> Runtime:
    kw.setdefault("type_check", False)
    return Runtime(store=open_store(store_url), tools=seen.tools(), clock=Clock(), **kw)


async def test_p25_each_call_gets_a_key_from_run_and_seq_recorded_in_the_journal(store_url):
    seen = Seen()
    async with runtime(store_url, seen, policy=Policy(writes="allow")) as rt:
        r = await rt.execute(PROGRAM)
        assert r.status == "completed", r.error
        read, write = seen.contexts
        assert (read.seq, read.kind, write.seq, write.kind) == (1, "read", 2, "write")
        assert read.run_id == write.run_id == r.run_id
        assert write.key == f"tether-{r.run_id}-2" and read.key == f"tether-{r.run_id}-1"
        assert write.send == 1 and write.address == "shop.charge"
        calls = {c.seq: c for c in rt.store.get_calls(r.run_id)}
        assert calls[2].idempotency_key == write.key and calls[2].sends == 1
        assert calls[1].idempotency_key == read.key
    assert current_call() is None  # nothing leaks outside a call


async def test_p25_the_key_is_the_same_after_a_pause_in_another_process(store_url):
    seen = Seen()
    async with runtime(store_url, seen) as rt:
        paused = await rt.execute(PROGRAM)
        assert paused.status == "paused"
        asked = rt.store.get_call(paused.run_id, 2)
        assert asked.state == "asked" and asked.idempotency_key == f"tether-{paused.run_id}-2"
    async with runtime(store_url, seen) as rt2:  # another runtime over the same store
        done = await rt2.resume(paused.run_id, "approve")
        assert done.status == "completed", done.error
    assert seen.contexts[-1].key == asked.idempotency_key and seen.contexts[-1].seq == 2


async def test_p25_a_recorded_key_wins_over_the_derivation(store_url):
    # The journal is the authority: a re-send after an upgrade that derived
    # keys differently must still send the key the first send carried.
    seen = Seen()
    async with runtime(store_url, seen) as rt:
        paused = await rt.execute(PROGRAM)
        assert rt.store.update_call(paused.run_id, 2, ["asked"], idempotency_key="recorded-elsewhere")
        done = await rt.resume(paused.run_id, "approve")
        assert done.status == "completed", done.error
    assert seen.contexts[-1].key == "recorded-elsewhere"


async def test_p25_gathered_calls_each_see_their_own_context(store_url):
    seen = Seen()
    # Gathered calls are numbered in argument order (P-1): charge(id=i) is call i + 1.
    program = "import asyncio\nimport tools\nawait asyncio.gather(" + ", ".join(
        f"tools.shop.charge(id={i})" for i in range(4)) + ")"
    async with runtime(store_url, seen, policy=Policy(writes="allow")) as rt:
        r = await rt.execute(program)
        assert r.status == "completed", r.error
    assert {i: c.key for i, c in seen.charged.items()} == {i: f"tether-{r.run_id}-{i + 1}" for i in range(4)}


# --- passed to every kind of tool -------------------------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = KeyedApi(tmp_path_factory.mktemp("keyed"))
    yield server
    server.stop()


CHARGE = """
import tools
item = await tools.pay.get_item(id=3)
await tools.pay.create_charge(order=ORDER, amount=item["price"])
"""


async def _run_openapi(store_url: str, api: KeyedApi, order: str, **source_kw) -> Any:
    async with OpenAPISource("pay", KeyedApi.SPEC, base_url=api.url, **source_kw) as source:
        async with Runtime(store=open_store(store_url), tools=source.tools(), type_check=False,
                           policy=Policy(writes="allow")) as rt:
            api.schema = rt.catalog.get("pay.create_charge").input_schema
            return await rt.execute(CHARGE.replace("ORDER", repr(order)))


async def test_p25_openapi_sends_the_key_as_idempotency_key_header_on_writes(store_url, api):
    r = await _run_openapi(store_url, api, "hdr-1")
    assert r.status == "completed", r.error
    (sent,) = [q for q in api.requests() if q["order"] == "hdr-1"]
    assert sent["key"] == f"tether-{r.run_id}-2"
    # The spec declares the header as a parameter; the key is tether's to set, not the program's.
    assert set(api.schema["properties"]) == {"order", "amount"}


async def test_p25_openapi_header_name_is_configurable_and_can_be_off(store_url, tmp_path, api):
    r = await _run_openapi(store_url, api, "hdr-2", idempotency_header="X-Request-Key")
    assert r.status == "completed", r.error
    (sent,) = [q for q in api.requests() if q["order"] == "hdr-2"]
    assert sent["key"] is None and sent["headers"]["x-request-key"] == f"tether-{r.run_id}-2"

    r = await _run_openapi(f"sqlite:///{tmp_path}/off.db", api, "hdr-3", idempotency_header=None)
    assert r.status == "completed", r.error
    (sent,) = [q for q in api.requests() if q["order"] == "hdr-3"]
    assert sent["key"] is None and not any(v.startswith("tether-run_") for v in sent["headers"].values())


async def test_p25_mcp_sends_the_key_in_the_request_meta(store_url):
    source = MCPSource("fx", command=[sys.executable, str(FIXTURES / "mcp_fixture_server.py")])
    async with source:
        async with Runtime(store=open_store(store_url), tools=source.tools(), type_check=False,
                           policy=Policy(writes="allow")) as rt:
            r = await rt.execute("import tools\nawait tools.fx.request_meta()")
    assert r.status == "completed", r.error
    # `-> dict` comes back as text (no structuredContent), and text stays text.
    assert json.loads(r.result)["meta"]["tether/idempotency-key"] == f"tether-{r.run_id}-1"


async def test_p25_python_tool_may_declare_a_call_context_parameter(store_url):
    keys: list[str] = []

    @tool(namespace="pay", idempotent_with_key=True)
    async def refund(order: str, call: CallContext) -> dict:
        """Refund an order."""
        keys.append(call.key)
        return {"refunded": order, "seq": call.seq, "send": call.send}

    (t,) = [refund.__tether_tool__.to_tool()]
    assert set(t.input_schema["properties"]) == {"order"} and t.dedupes_by_key
    async with Runtime(store=open_store(store_url), tools=[refund], type_check=False,
                       policy=Policy(writes="allow")) as rt:
        r = await rt.execute("import tools\nawait tools.pay.refund(order='o-1')")
        assert r.status == "completed", r.error
        assert r.result == {"refunded": "o-1", "seq": 1, "send": 1}
        assert keys == [f"tether-{r.run_id}-1"]
        bad = await rt.execute("import tools\nawait tools.pay.refund(order='o-2', call=None)")
        assert bad.status == "failed" and "call" in bad.error["message"]

"""Idempotency keys: derived per call, recorded, passed to every kind of tool (P-25)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Clock, KeyedApi
from tether import CallContext, Limits, current_call, tool
from tether._engine.calls import ledger
from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._sources.mcp import MCPSource
from tether._sources.openapi import OpenAPISource
from tether._store import open_store
from tether._tools.model import Annotations, Tool
from tether.errors import ToolError

FIXTURES = Path(__file__).parent.parent / "fixtures"

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
        # Re-signed as tether would have recorded it (an unsigned edit is run_tampered, P-35).
        assert ledger.move(rt.engine.store, rt.engine.keyring, rt.store.get_call(paused.run_id, 2), ["asked"],
                           idempotency_key="recorded-elsewhere")
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


@pytest.mark.slow  # starts an MCP server process
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


# --- re-sending with the same key (P-31) ---------------------------------------------

FAST = Limits(call_timeout_seconds=0.3, key_backoff_seconds=0.01)
# Against the keyed API: the re-sends wait at least 0.05 + 0.1 + 0.2 + 0.4 s
# in all, longer than the API's 0.5 s of slow processing.
KEYED = Limits(call_timeout_seconds=0.3, key_backoff_seconds=0.1)


class Flaky:
    """A charge whose first ``bad`` sends fail the given way; it dedupes by key like a payment API."""

    def __init__(self, bad: int, how: str = "hang") -> None:
        self.bad, self.how = bad, how
        self.sends: list[CallContext] = []
        self.effects: dict[str, int] = {}

    def tool(self, **kw) -> Tool:
        async def charge(args: dict) -> Any:
            call = current_call()
            self.sends.append(call)
            first = call.key not in self.effects
            self.effects.setdefault(call.key, args["id"])  # the effect, once per key
            if len(self.sends) <= self.bad:
                if self.how == "hang":
                    await asyncio.sleep(30)
                if self.how == "drop":
                    raise ConnectionResetError("connection reset by peer")
                if self.how == "busy":
                    raise ToolError("HTTP 409: still being processed", details={"outcome": "in_progress"})
                raise ValueError("card declined")
            return {"charged": args["id"], "replayed": not first}

        return Tool("shop", "charge", "Charge (a write).", ID_SCHEMA, charge, **kw)


async def _charge(store_url: str, flaky: Flaky, limits: Limits = FAST, **tool_kw) -> Any:
    async with Runtime(store=open_store(store_url), tools=[flaky.tool(**tool_kw)], type_check=False,
                       policy=Policy(writes="allow"), limits=limits) as rt:
        r = await rt.execute("import tools\nawait tools.shop.charge(id=7)")
        return r, rt.store.get_call(r.run_id, 1)


async def test_p31_a_write_that_times_out_is_re_sent_with_the_same_key_when_the_tool_dedupes(store_url):
    flaky = Flaky(bad=1)
    r, entry = await _charge(store_url, flaky, idempotency="key")
    assert r.status == "completed", r.error
    assert r.result == {"charged": 7, "replayed": True}  # the callee made the second send a replay
    assert [(c.key, c.send) for c in flaky.sends] == [(entry.idempotency_key, 1), (entry.idempotency_key, 2)]
    assert entry.state == "sent" and entry.sends == 2
    assert flaky.effects == {entry.idempotency_key: 7}


async def test_p31_a_dropped_connection_is_re_sent_too(store_url):
    flaky = Flaky(bad=2, how="drop")
    r, entry = await _charge(store_url, flaky, idempotency="key")
    assert r.status == "completed", r.error
    assert [c.send for c in flaky.sends] == [1, 2, 3] and entry.sends == 3


async def test_p31_a_tool_error_with_a_known_outcome_is_not_re_sent(store_url):
    flaky = Flaky(bad=1, how="fail")
    r, entry = await _charge(store_url, flaky, idempotency="key")
    assert r.status == "failed" and "[tool_error]" in r.error["message"]
    assert len(flaky.sends) == 1 and entry.state == "failed"


@pytest.mark.parametrize("annotations", [Annotations(), Annotations(idempotent=True)], ids=["plain", "idempotent_hint"])
async def test_p31_without_a_declared_key_nothing_changes(store_url, annotations):
    # D-18: an idempotent hint is not a promise to dedupe; the write is not re-sent.
    flaky = Flaky(bad=1)
    r, entry = await _charge(store_url, flaky, annotations=annotations)
    assert r.status == "failed" and r.error["code"] == "write_outcome_unknown"
    assert len(flaky.sends) == 1 and entry.state == "unknown" and entry.sends == 1


@pytest.mark.parametrize("how", ["hang", "busy"])
async def test_p31_re_sends_are_bounded_then_the_outcome_is_unknown(store_url, how):
    flaky = Flaky(bad=99, how=how)
    r, entry = await _charge(store_url, flaky, FAST.replace(key_sends=3), idempotency="key")
    assert r.status == "failed" and r.error["code"] == "write_outcome_unknown"
    assert "sent 3 times with idempotency key " + entry.idempotency_key in r.error["message"]
    assert [c.send for c in flaky.sends] == [1, 2, 3]
    assert entry.state == "unknown" and entry.sends == 3


async def _left_sending(store_url: str, sends: int, tool: Tool) -> str:
    """A run whose process died with its write marked sending (what the crash tests make by SIGKILL)."""
    async with Runtime(store=open_store(store_url), tools=[tool], type_check=False, clock=Clock()) as rt:
        paused = await rt.execute("import tools\nawait tools.shop.charge(id=7)")
        assert paused.status == "paused"
        # Signed as the dead process would have written it (P-35).
        entry = rt.store.get_call(paused.run_id, 1)
        assert ledger.move(rt.engine.store, rt.engine.keyring, entry, ["asked"], state="approved")
        assert ledger.move(rt.engine.store, rt.engine.keyring, entry, ["approved"], state="sending", sends=sends)
        assert rt.store.update_run(paused.run_id, ["paused"], status="running", owner="dead", lease_until=0.0)
        return paused.run_id


@pytest.fixture(params=["sqlite", "postgres"])
def any_store(request, store_url):
    return store_url if request.param == "sqlite" else request.getfixturevalue("pg_url")


async def test_p31_recovery_re_sends_a_write_left_sending_with_its_recorded_key(any_store):
    store_url = any_store
    flaky = Flaky(bad=0)
    run_id = await _left_sending(store_url, 1, flaky.tool(idempotency="key"))
    # A clock before every real lease: on a shared Postgres this recovers only the run made here.
    async with Runtime(store=open_store(store_url), tools=[flaky.tool(idempotency="key")], type_check=False,
                       limits=FAST, clock=Clock(1.0)) as rt:
        (r,) = await rt.recover()
        entry = rt.store.get_call(run_id, 1)
    assert r.status == "completed", r.error
    assert [(c.key, c.send) for c in flaky.sends] == [(entry.idempotency_key, 2)]
    assert entry.state == "sent" and entry.sends == 2


@pytest.mark.parametrize("sends, key", [(1, False), (5, True)], ids=["undeclared", "sends_spent"])
async def test_p31_recovery_without_a_key_or_sends_left_fails_unknown_as_before(store_url, sends, key):
    flaky = Flaky(bad=0)
    kw = {"idempotency": "key"} if key else {}
    run_id = await _left_sending(store_url, sends, flaky.tool(**kw))
    async with Runtime(store=open_store(store_url), tools=[flaky.tool(**kw)], type_check=False,
                       limits=FAST) as rt:
        (r,) = await rt.recover()
        assert rt.store.get_call(run_id, 1).state == "unknown"
    assert r.status == "failed" and r.error["code"] == "write_outcome_unknown"
    assert flaky.sends == []
    if key:
        assert f"sent 5 times with idempotency key tether-{run_id}-1" in r.error["message"]


# --- the keyed API: a per-call timeout, with and without the key declared ------------


async def _charge_once(store_url: str, api: KeyedApi, order: str, **source_kw) -> Any:
    async with OpenAPISource("pay", KeyedApi.SPEC, base_url=api.url, **source_kw) as source:
        # Only the write is under the short call timeout (KEYED): on a loaded
        # machine the read before it could time out too and end the run first.
        tools = [t if t.is_write else dataclasses.replace(t, timeout_seconds=60) for t in source.tools()]
        async with Runtime(store=open_store(store_url), tools=tools, type_check=False,
                           policy=Policy(writes="allow"), limits=KEYED) as rt:
            r = await rt.execute(CHARGE.replace("ORDER", repr(order)))
            return r, rt.store.get_call(r.run_id, 2)


def _ended(r: Any) -> str:
    return r.status if r.status != "failed" else r.error["code"]


def _ledger(api: KeyedApi, order: str) -> dict[str, int]:
    return {"requests": sum(q["order"] == order for q in api.requests()),
            "effects": sum(e["order"] == order for e in api.effects())}


@pytest.mark.parametrize("phase", ["answer", "process"])
async def test_p31_openapi_write_answered_after_the_timeout_takes_effect_once(store_url, api, phase, ledger_report):
    # "answer": the API charges at once and answers after the timeout;
    # "process": it holds the key that long first, so a re-send meanwhile gets 409.
    api.control(slow_first=0.5, slow_phase=phase)
    try:
        r, entry = await _charge_once(store_url, api, f"late-{phase}", idempotency="key")
    finally:
        api.control(slow_first=0)
    assert r.status == "completed", r.error
    assert r.result["charged"] == f"late-{phase}"
    counts = _ledger(api, f"late-{phase}")
    ledger_report(f"per-call timeout, key declared, {phase} late", runs=1, **{_ended(r): 1}, **counts)
    assert counts["effects"] == 1 and counts["requests"] >= 2
    assert entry.state == "sent" and entry.sends == counts["requests"]
    assert {q["key"] for q in api.requests() if q["order"] == f"late-{phase}"} == {entry.idempotency_key}


async def test_p31_openapi_write_answered_after_the_timeout_without_a_declared_key_is_unknown(
        store_url, api, ledger_report):
    api.control(slow_first=1.0, slow_phase="answer")
    try:
        r, entry = await _charge_once(store_url, api, "late-undeclared")
    finally:
        api.control(slow_first=0)
    assert r.status == "failed" and r.error["code"] == "write_outcome_unknown"
    counts = _ledger(api, "late-undeclared")
    ledger_report("per-call timeout, key undeclared", runs=1, **{_ended(r): 1}, **counts)
    assert counts == {"requests": 1, "effects": 1}  # it happened, and tether says it does not know
    assert entry.state == "unknown" and entry.sends == 1


def test_p31_config_declares_keys_per_source():
    from tether._config import Config
    from tether.errors import ConfigError

    config = Config.from_dict({"sources": [
        {"type": "openapi", "namespace": "pay", "spec": "p.json", "idempotency": "key"},
        {"type": "mcp", "namespace": "billing", "command": ["x"], "idempotency": "key"},
        {"type": "python", "module": "m.py", "idempotency": "key"},
        {"type": "openapi", "namespace": "plain", "spec": "p.json", "idempotency_header": False},
    ]})
    assert [s.idempotency for s in config.sources] == ["key", "key", "key", "none"]
    assert config.sources[0].idempotency_header == "Idempotency-Key" and config.sources[3].idempotency_header is False
    with pytest.raises(ConfigError, match="needs idempotency_header"):
        Config.from_dict({"sources": [{"type": "openapi", "namespace": "pay", "spec": "p.json",
                                       "idempotency": "key", "idempotency_header": False}]})
    with pytest.raises(ConfigError, match="idempotency"):
        Config.from_dict({"sources": [{"type": "mcp", "namespace": "b", "command": ["x"], "idempotency": "yes"}]})


async def test_p31_a_python_source_declared_key_in_config_is_re_sent(tmp_path):
    from tether._app import open_runtime
    from tether._config import Config

    module = tmp_path / "payments.py"
    module.write_text('''
from tether import current_call, tool

SENDS = []

@tool
def refund(order: str) -> dict:
    """Refund an order (a write the payment API dedupes by key)."""
    SENDS.append(current_call().key)
    if len(SENDS) == 1:
        raise ConnectionResetError("connection reset by peer")
    return {"refunded": order, "sends": len(SENDS)}
''')
    config = Config.from_dict({
        "store": {"url": f"sqlite:///{tmp_path}/t.db"},
        "policy": {"writes": "allow"},
        "limits": {"key_backoff_seconds": 0.01},
        "sandbox": {"type_check": False},
        "sources": [{"type": "python", "module": str(module), "idempotency": "key"}],
    })
    async with open_runtime(config) as rt:
        r = await rt.execute("import tools\nawait tools.payments.refund(order='A-1')")
        assert r.status == "completed", r.error
        assert r.result == {"refunded": "A-1", "sends": 2}
        assert rt.store.get_call(r.run_id, 1).sends == 2


@pytest.mark.slow  # starts an MCP server process
@pytest.mark.parametrize("declared", [True, False], ids=["key_declared", "undeclared"])
async def test_p31_mcp_server_dying_mid_call_is_re_sent_only_when_it_dedupes(store_url, tmp_path, declared):
    # The server takes the charge, then dies before answering: a dropped connection.
    log = tmp_path / "charges.log"
    source = MCPSource("fx", command=[sys.executable, str(FIXTURES / "mcp_fixture_server.py")],
                       idempotency="key" if declared else "none")
    async with source:
        # Long enough for a re-send to restart the server and reconnect.
        async with Runtime(store=open_store(store_url), tools=source.tools(), type_check=False,
                           policy=Policy(writes="allow"), limits=Limits(key_backoff_seconds=0.05)) as rt:
            r = await rt.execute(f"import tools\nawait tools.fx.charge_once(log={str(log)!r}, order='A-1')")
            entry = rt.store.get_call(r.run_id, 1)
    assert log.read_text().splitlines() == [f"{entry.idempotency_key} A-1"]  # took effect once
    if declared:
        assert r.status == "completed", r.error
        assert r.result == {"result": "charged A-1 (replayed)"} and entry.sends == 2
    else:  # as before: reported, not sent again
        assert r.status == "failed" and "whether it took effect is unknown" in r.error["message"]
        assert entry.sends == 1
        # P-8: the request left and its answer was lost, so the write is
        # unknown (reported as such), not a failure someone might retry.
        assert entry.state == "unknown" and r.error["code"] == "write_outcome_unknown"

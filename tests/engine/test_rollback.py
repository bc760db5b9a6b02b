"""P-46: undoing what a run did — a person's decline-and-undo at a pause, or an undo of an ended run.

Each compensation is a journaled write of its own (write-ahead, its idempotency key derived from the
original call's), sent once, newest first; a write without an undo, or whose outcome is unknown, is listed
as not undone with why. The same tests run on SQLite and on Postgres.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tether import Limits, Policy, Runtime, tool
from tether._engine.rollback.plan import UNDO_OP, undo_key
from tether._sources.python import tools_from_module
from tether._store import open_store
from tether._store.states import CallState, RunStatus
from tether.errors import NotPaused

THREE_WRITES = """
import tools
a = await tools.shop.charge(order="a", amount=10)
b = await tools.shop.charge(order="b", amount=20)
c = await tools.shop.charge(order="c", amount=30)
t = await tools.shop.transfer(amount=60)
t
"""

# With a note between the charges: a write that declares no undo.
PROGRAM = """
import tools
a = await tools.shop.charge(order="a", amount=10)
b = await tools.shop.charge(order="b", amount=20)
n = await tools.shop.note(text="charged a and b")
c = await tools.shop.charge(order="c", amount=30)
t = await tools.shop.transfer(amount=60)
t
"""

# The fourth write asks; everything else is allowed, undos included (a rule could make them ask).
POLICY = Policy(writes="allow", rules=[{"match": "shop.transfer", "action": "ask"}])


class Shop:
    """A shop's tools whose every effect is kept in order, with the idempotency key it came with."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str, str | None]] = []
        self.refunded: dict[str, str] = {}  # idempotency key -> charge id: repeats take effect once
        self.on_refund: Any = None  # called with each refund's charge id as it arrives

    def module(self):
        shop = self
        import types

        from tether import current_call

        mod = types.ModuleType("shop_tools")

        @tool(namespace="shop", undo="shop.refund", undo_args=lambda args, result: {"charge_id": result["id"]})
        async def charge(order: str, amount: int) -> dict:
            """Charge an order."""
            if order == "slow":
                await asyncio.sleep(2)  # past the call timeout: its outcome is unknown (P-8)
            shop.effects.append(("charge", order, current_call().key))
            return {"id": f"ch_{order}", "amount": amount}

        @tool(namespace="shop", idempotent_with_key=True)
        async def refund(charge_id: str) -> dict:
            """Refund a charge (dedupes by idempotency key)."""
            key = current_call().key
            if shop.on_refund is not None and (hang := shop.on_refund(charge_id)) is not None:
                await hang
            if key not in shop.refunded:
                shop.refunded[key] = charge_id
                shop.effects.append(("refund", charge_id, key))
            return {"refunded": charge_id}

        @tool(namespace="shop")
        def note(text: str) -> str:
            """Write a note to the customer (cannot be taken back)."""
            shop.effects.append(("note", text, current_call().key))
            return "ok"

        @tool(namespace="shop")
        def transfer(amount: int) -> str:
            """Transfer money out."""
            shop.effects.append(("transfer", str(amount), current_call().key))
            return "sent"

        for f in (charge, refund, note, transfer):
            setattr(mod, f.__name__, f)
        return tools_from_module(mod)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/tether.db"
    return request.getfixturevalue("pg_url")


def _fresh(url: str) -> None:
    if url.startswith("postgres"):
        store = open_store(url)
        try:
            for run in store.list_runs(limit=10_000):
                store.delete_run(run.run_id)
        finally:
            store.close()


async def test_p46_decline_and_undo_at_the_fourth_write_undoes_the_three_newest_first(url):
    _fresh(url)
    shop = Shop()
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as rt:
        paused = await rt.execute(THREE_WRITES)
        assert paused.status == "paused" and (paused.pending["seq"], paused.pending["address"]) == (4, "shop.transfer")
        assert "undo" not in paused.pending["writes"][0]  # shop.transfer declares none; a charge would say so
        run_id = paused.run_id
        result = await rt.decide(run_id, {4: ("decline_and_undo", "wrong customer")})

        assert result.status == RunStatus.ROLLED_BACK
        # Each undo sent once, in reverse order of the writes, with a key derived from the original's.
        refunds = [e for e in shop.effects if e[0] == "refund"]
        assert [e[1] for e in refunds] == ["ch_c", "ch_b", "ch_a"]
        assert [e[2] for e in refunds] == [undo_key(f"tether-{run_id}-{s}") for s in (3, 2, 1)]
        assert not any(e[0] == "transfer" for e in shop.effects)
        assert [(x["seq"], x["undone"], x["undo"]["seq"]) for x in result.rollback] == [(3, True, 5), (2, True, 6),
                                                                                        (1, True, 7)]
        assert result.error["code"] == "rolled_back"
        assert "undone: call 3 shop.charge, call 2 shop.charge, call 1 shop.charge" in result.error["message"]

        calls = rt.store.get_calls(run_id)
        undos = [c for c in calls if c.op == UNDO_OP]
        assert [(c.seq, c.state, c.sends, c.args) for c in undos] == [
            (5, CallState.SENT, 1, {"charge_id": "ch_c"}), (6, CallState.SENT, 1, {"charge_id": "ch_b"}),
            (7, CallState.SENT, 1, {"charge_id": "ch_a"})]
        # The declined write names what was undone: what the program is told at that call.
        declined = next(c for c in calls if c.seq == 4)
        assert declined.state == CallState.DECLINED
        assert declined.error["message"].startswith("[write_rolled_back]")
        assert "call 3 shop.charge by shop.refund" in declined.error["message"]
        assert rt.store.get_run(run_id).status == RunStatus.ROLLED_BACK
        decided = [e.data for e in rt.store.get_events(run_id) if e.type == "decided"]
        assert [(d["seq"], d["decision"], d["reason"]) for d in decided] == [(4, "decline_and_undo", "wrong customer")]

        # A repeat changes nothing and sends nothing.
        again = await rt.resume(run_id, "undo")
        assert again.status == RunStatus.ROLLED_BACK
        assert len([e for e in shop.effects if e[0] == "refund"]) == 3


async def test_p46_a_write_without_an_undo_is_listed_not_undone_with_why(url):
    _fresh(url)
    shop = Shop()
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as rt:
        paused = await rt.execute(PROGRAM)
        result = await rt.decide(paused.run_id, {paused.pending["seq"]: "decline_and_undo"})
        assert [e[1] for e in shop.effects if e[0] == "refund"] == ["ch_c", "ch_b", "ch_a"]
        lines = {x["seq"]: x for x in result.rollback}
        assert [x["seq"] for x in result.rollback] == [4, 3, 2, 1]
        assert lines[3] == {"seq": 3, "address": "shop.note", "undone": False, "why": "shop.note declares no undo"}
        assert "not undone: call 3 shop.note (shop.note declares no undo)" in result.error["message"]


async def test_p46_an_ended_run_is_undone_and_an_unknown_write_is_reported_not_undone(url):
    _fresh(url)
    shop = Shop()
    program = """
import tools
a = await tools.shop.charge(order="a", amount=10)
try:
    await tools.shop.charge(order="slow", amount=5)
except TimeoutError:
    pass
b = await tools.shop.charge(order="b", amount=20)
b["id"]
"""
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False,
                       limits=Limits(call_timeout_seconds=0.3)) as rt:
        done = await rt.execute(program)
        assert done.status == "completed", done.error
        assert rt.store.get_call(done.run_id, 2).state == CallState.UNKNOWN

        result = await rt.resume(done.run_id, "undo", "the customer cancelled")

        assert result.status == RunStatus.ROLLED_BACK
        assert [e[1] for e in shop.effects if e[0] == "refund"] == ["ch_b", "ch_a"]
        assert [(x["seq"], x["undone"]) for x in result.rollback] == [(3, True), (2, False), (1, True)]
        assert "outcome is unknown" in result.rollback[1]["why"]
        assert "not undone: call 2 shop.charge" in result.error["message"]
        assert rt.store.get_run(done.run_id).status == RunStatus.ROLLED_BACK


async def test_p46_an_ended_run_that_wrote_nothing_says_so_rather_than_that_writes_were_rolled_back(tmp_path):
    async with Runtime(store=open_store(f"sqlite:///{tmp_path}/t.db"), tools=Shop().module(), policy=POLICY,
                       type_check=False) as rt:
        done = await rt.execute("1 + 1")
        result = await rt.resume(done.run_id, "undo", "changed my mind")
        assert result.status == RunStatus.ROLLED_BACK and result.rollback == []
        assert result.error["message"] == "the run made no writes to roll back; nothing was undone"


async def test_p46_a_running_run_is_not_undone(url):
    _fresh(url)
    shop = Shop()
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as rt:
        handle = await rt.begin("import asyncio\nawait asyncio.sleep(0.5)\n1")
        with pytest.raises(NotPaused) as raised:
            await rt.resume(handle.run_id, "undo")
        assert "nothing was undone" in raised.value.message
        await handle.result()
        assert shop.effects == []
    await asyncio.sleep(0)


async def test_p46_undo_is_a_write_policy_denies_it_and_the_budget_counts_it(url):
    """D-68: a rule denying the undo's tool, or a budget with no room, leaves the write not undone, with why."""
    _fresh(url)
    shop = Shop()
    program = "import tools\nawait tools.shop.charge(order='a', amount=1)\nawait tools.shop.charge(order='b', amount=2)\n"
    denied = Policy(writes="allow", rules=[{"match": "shop.refund", "action": "deny"}])
    async with Runtime(store=open_store(url), tools=shop.module(), policy=denied, type_check=False) as rt:
        done = await rt.execute(program)
        result = await rt.resume(done.run_id, "undo")
        assert [x["why"] for x in result.rollback] == ["the policy denies its undo shop.refund"] * 2
    tight = Policy(writes="allow", write_budget=3)
    async with Runtime(store=open_store(url), tools=shop.module(), policy=tight, type_check=False) as rt:
        done = await rt.execute(program)
        result = await rt.resume(done.run_id, "undo")
        # Two writes spent, room for one undo: the newest is undone, the older is not.
        assert [(x["seq"], x["undone"]) for x in result.rollback] == [(2, True), (1, False)]
        assert result.rollback[1]["why"] == "its undo shop.refund would pass the write budget (3)"
    assert [e[1] for e in shop.effects if e[0] == "refund"] == ["ch_b"]


async def test_p46_a_rollback_whose_process_stopped_is_finished_by_another_runtime(url):
    """P-46 with P-11: the plan recorded and nothing sent when its owner stops; a second runtime on the same
    store takes the run over once the lease lapses and sends each undo once, newest first."""
    from tether._engine.approvals.model import batch_of
    from tether._engine.rollback import runner

    _fresh(url)
    shop = Shop()
    first = Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False, lease_seconds=0.3)
    async with first:
        paused = await first.execute(PROGRAM)
        run = first.store.get_run(paused.run_id)
        taken = await runner.begin(first.engine, run, declined=batch_of(run), decision={"decision": "decline_and_undo"})
        assert taken is not None and first.store.get_run(run.run_id).status == RunStatus.RUNNING
        # Its process stops here: the plan is stored, no undo was recorded or sent.
    assert not any(e[0] == "refund" for e in shop.effects)
    await asyncio.sleep(0.4)
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as second:
        (result,) = [r for r in await second.recover() if r.run_id == run.run_id]
        assert result.status == RunStatus.ROLLED_BACK
        assert [e[1] for e in shop.effects if e[0] == "refund"] == ["ch_c", "ch_b", "ch_a"]
        assert second.store.get_call(run.run_id, 5).error["message"].startswith("[write_rolled_back]")


async def test_p42_a_rolled_back_run_is_forgotten_after_its_days_as_the_config_defaults_say(url):
    # A rolled_back run is ended: retention must reach it, or every rollback is kept forever (P-42, P-46).
    from tether._config import RetentionConfig
    from tether._store.retention import DAY, prune_all

    _fresh(url)
    shop = Shop()
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as rt:
        paused = await rt.execute(THREE_WRITES)
        rolled = await rt.decide(paused.run_id, {4: "decline_and_undo"})
        assert rolled.status == RunStatus.ROLLED_BACK
        rules = RetentionConfig().rules()
        now = rt.engine.clock()
        assert prune_all(rt.store, rules, now + 89 * DAY).runs == 0  # kept as long as a failure
        assert prune_all(rt.store, rules, now + 91 * DAY).runs == 1
        assert rt.store.get_run(paused.run_id) is None and rt.store.get_calls(paused.run_id) == []


async def test_p46_p45_decline_and_undo_of_a_guarded_run_sends_the_undos(url):
    # Under writes = "guard" an undo left at the mode's default goes as an asked one does (D-68): the charges
    # (literal orders) went out unasked, the transfer asks by a rule, and the person's decline undoes them.
    _fresh(url)
    shop = Shop()
    guarded = Policy(writes="guard", rules=[{"match": "shop.transfer", "action": "ask"}])
    async with Runtime(store=open_store(url), tools=shop.module(), policy=guarded, type_check=False) as rt:
        paused = await rt.execute(THREE_WRITES)
        assert paused.status == "paused" and paused.pending["seq"] == 4, paused.error
        result = await rt.decide(paused.run_id, {4: "decline_and_undo"})
        assert result.status == RunStatus.ROLLED_BACK, result.error
        assert [e[1] for e in shop.effects if e[0] == "refund"] == ["ch_c", "ch_b", "ch_a"]


async def test_p46_p35_a_rollback_whose_journal_was_edited_is_refused_by_the_process_taking_it_over(tmp_path):
    """P-46 with P-35: the plan recorded, its owner stopped, a journal row edited outside tether. The process
    that takes the run over refuses it (ended ``run_tampered``, not left running for takeover after takeover)
    and sends no undo."""
    import sqlite3

    from tether._engine.approvals.model import batch_of
    from tether._engine.rollback import runner

    url = f"sqlite:///{tmp_path}/tether.db"
    shop = Shop()
    first = Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False, lease_seconds=0.3)
    async with first:
        paused = await first.execute(PROGRAM)
        run = first.store.get_run(paused.run_id)
        assert await runner.begin(first.engine, run, declined=batch_of(run), decision={"decision": "decline_and_undo"})
    with sqlite3.connect(tmp_path / "tether.db") as db:
        db.execute("UPDATE calls SET args = ? WHERE run_id = ? AND seq = 1", ('{"order":"z","amount":1}', run.run_id))
    await asyncio.sleep(0.4)
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as second:
        (result,) = [r for r in await second.recover() if r.run_id == run.run_id]
        assert result.status == RunStatus.FAILED and result.error["code"] == "run_tampered", result
        assert second.store.get_run(run.run_id).status == RunStatus.FAILED
    assert not any(e[0] == "refund" for e in shop.effects)


async def test_p46_p35_an_undo_entry_forged_in_the_store_under_a_rollback_is_refused_not_reported_undone(tmp_path):
    """P-46 with P-35: while the first undo is on the wire, a row is written outside tether where the next undo
    will be journaled, saying it was sent. The rollback reads that entry when its own record is refused: the
    forgery fails its check and the run ends refused, never reporting a write undone that no undo reached."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/tether.db"
    shop = Shop()

    def forge(charge_id: str) -> None:
        if charge_id != "ch_c":
            return
        with sqlite3.connect(tmp_path / "tether.db") as db:
            cols = [r[1] for r in db.execute("PRAGMA table_info(calls)")]
            picked = ", ".join("6" if c == "seq" else "'sent'" if c == "state" else c for c in cols)
            db.execute(f"INSERT INTO calls ({', '.join(cols)}) SELECT {picked} FROM calls WHERE seq = 5")

    shop.on_refund = forge
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as rt:
        paused = await rt.execute(THREE_WRITES)
        result = await rt.decide(paused.run_id, {4: ("decline_and_undo", "wrong customer")})
        assert result.status == RunStatus.FAILED and result.error["code"] == "run_tampered", result
        assert not any(line.get("undone") and line["seq"] == 2 for line in result.rollback or [])
    assert [e[1] for e in shop.effects if e[0] == "refund"] == ["ch_c"]


async def test_p46_p8_an_undo_whose_tool_hangs_is_cut_at_the_call_timeout_and_listed_unknown(tmp_path):
    """P-46 with P-8: a compensation is host work with a deadline. An undo tool that does not answer is cut at
    the call timeout, its outcome recorded unknown (never sent again), and the run ends rolled_back naming it."""
    url = f"sqlite:///{tmp_path}/tether.db"
    shop = Shop()
    shop.on_refund = lambda charge_id: asyncio.sleep(30) if charge_id == "ch_c" else None
    async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False,
                       limits=Limits(call_timeout_seconds=0.3)) as rt:
        paused = await rt.execute(THREE_WRITES)
        result = await rt.decide(paused.run_id, {4: ("decline_and_undo", None)})
        assert result.status == RunStatus.ROLLED_BACK
        assert [(x["seq"], x["undone"], x["undo"]["state"]) for x in result.rollback] == [
            (3, False, "unknown"), (2, True, "sent"), (1, True, "sent")]
        assert "outcome is unknown" in result.rollback[0]["why"]


async def test_p46_p28_an_approval_racing_a_decline_and_undo_from_another_process_ends_one_way(url):
    """Two people, two runtimes, one store: one approves the paused transfer while the other declines it and
    asks for the run's writes undone. Either the transfer is sent and nothing is undone, or it is not sent
    and every charge is refunded once; never both, never neither with the run left paused (P-28, P-46)."""
    for i in range(4):
        _fresh(url)
        shop = Shop()
        async with Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as a, \
                Runtime(store=open_store(url), tools=shop.module(), policy=POLICY, type_check=False) as b:
            paused = await a.execute(THREE_WRITES)

            async def undo(rt: Runtime, run_id: str, after: float):
                await asyncio.sleep(after)
                return await rt.decide(run_id, {4: ("decline_and_undo", "no")}, actor="ben")

            await asyncio.gather(a.decide(paused.run_id, {4: "approve"}, actor="ann"), undo(b, paused.run_id, i * 0.002),
                                 return_exceptions=True)
            final = await a.engine.wait_for_run(paused.run_id)
            kinds = sorted(e[0] for e in shop.effects)
            if final.status == RunStatus.ROLLED_BACK:
                assert kinds == ["charge"] * 3 + ["refund"] * 3, kinds
            else:
                assert final.status == RunStatus.COMPLETED and kinds == ["charge"] * 3 + ["transfer"], (final, kinds)
            decided = [(e.data["seq"], e.data["decision"]) for e in a.store.get_events(paused.run_id)
                       if e.type == "decided"]
            # An undo overrides an approval (P-46), as a cancel does: both may be recorded, once each.
            assert len(decided) == len(set(decided)), decided

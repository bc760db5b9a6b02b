"""P-46: the rollback's plan and its one decision, ``next_move`` — pure functions every backend shares."""

from __future__ import annotations

from tether._engine.rollback.plan import Step, make_plan, next_move, undo_key
from tether._engine.rules.policy import Policy
from tether._store.base import CallRecord
from tether._store.states import CallState
from tether._tools.undo import Undo


def entry(seq: int, address: str, state: str, *, op: str = "tool", outcome=None, sends: int = 0) -> CallRecord:
    return CallRecord("r", seq, op, address, {"n": seq}, f"k{seq}", "write", CallState(state), outcome=outcome,
                      idempotency_key=f"tether-r-{seq}", sends=sends)


UNDOS = {"s.charge": Undo("s.refund", {"id": "result.id"})}


def test_p46_the_plan_lists_every_applied_write_newest_first_and_says_why_one_is_not_undone():
    journal = [entry(1, "s.charge", "sent", outcome={"id": "a"}), entry(2, "s.note", "sent"),
               entry(3, "s.charge", "unknown"), entry(4, "s.charge", "failed"), entry(5, "s.charge", "declined"),
               entry(6, "s.charge", "sent", outcome={"id": "b"}), entry(7, "s.charge", "sent", outcome={})]
    steps = make_plan(journal, UNDOS.get, Policy(writes="allow", write_budget=20))
    assert [(s.seq, s.undo, s.undo_seq, s.key) for s in steps] == [
        (7, None, None, None), (6, "s.refund", 8, undo_key("tether-r-6")), (3, None, None, None),
        (2, None, None, None), (1, "s.refund", 9, undo_key("tether-r-1"))]
    assert steps[0].why == "its undo s.refund could not be made: the original call's result has no 'result.id'"
    assert steps[1].args == {"id": "b"}
    assert "outcome is unknown" in (steps[2].why or "")
    assert steps[3].why == "s.note declares no undo"


def test_p46_next_move_sends_one_undo_at_a_time_newest_first_and_never_twice():
    steps = [Step(3, "s.charge", "s.refund", {"id": "c"}, 5, "k5"), Step(2, "s.note", why="none"),
             Step(1, "s.charge", "s.refund", {"id": "a"}, 6, "k6")]
    dedupes = {"s.refund": True}.get

    def move(journal: dict, dedupe=lambda a: bool(dedupes(a)), sends: int = 5) -> tuple[str, int | None]:
        m = next_move(steps, journal, dedupe, sends)
        return m.kind, m.step.seq if m.step else None

    assert move({}) == ("record", 3)
    assert move({5: entry(5, "s.refund", "approved", op="undo")}) == ("send", 3)
    assert move({5: entry(5, "s.refund", "sending", op="undo", sends=1)}) == ("resend", 3)
    assert move({5: entry(5, "s.refund", "sending", op="undo", sends=5)}) == ("lost", 3)  # its sends ran out
    assert move({5: entry(5, "s.refund", "sending", op="undo", sends=1)}, dedupe=lambda a: False) == ("lost", 3)
    assert move({5: entry(5, "s.refund", "sent", op="undo")}) == ("record", 1)
    assert move({5: entry(5, "s.refund", "failed", op="undo")}) == ("record", 1)  # a failed undo is reported
    done = {5: entry(5, "s.refund", "sent", op="undo"), 6: entry(6, "s.refund", "unknown", op="undo")}
    assert move(done) == ("done", None)


def test_p46_a_write_an_earlier_rollback_undid_is_not_undone_again():
    journal = [entry(1, "s.charge", "sent", outcome={"id": "a"}), entry(2, "s.charge", "sent", outcome={"id": "b"}),
               CallRecord("r", 3, "undo", "s.refund", {"id": "b"}, "k3", "write", CallState.SENT,
                          idempotency_key=undo_key("tether-r-2"))]
    steps = make_plan(journal, UNDOS.get, Policy(writes="allow", write_budget=20))
    assert [(s.seq, s.undo, s.undo_seq, s.why) for s in steps] == [
        (2, None, None, "an earlier rollback sent its undo (call 3)"), (1, "s.refund", 4, None)]

"""execute(on_approval=...): the answers it takes, and a usage error for anything else."""

from __future__ import annotations

import pytest

from helpers import Clock, Recorder
from tether import Decision
from tether._runtime import Runtime
from tether._store import open_store

WRITE = "import tools\nawait tools.helpdesk.close_ticket(id=1)"


def _runtime(tmp_path, rec: Recorder) -> Runtime:
    return Runtime(store=open_store(f"sqlite:///{tmp_path / 't.db'}"), tools=rec.tools(), clock=Clock(),
                   type_check=False)


@pytest.mark.parametrize("answer, sent", [
    ("approve", True), ("decline", False), (True, True), (False, False),
    (("approve", None), True), (("decline", "not today"), False), ((True, "fine"), True),
    (Decision(1, "approve"), True), (Decision(1, "decline", "no"), False),
])
async def test_documented_answers_decide_the_write(tmp_path, answer, sent):
    rec = Recorder()

    async def approver(pending: dict) -> object:
        assert pending["address"] == "helpdesk.close_ticket"
        return answer

    async with _runtime(tmp_path, rec) as rt:
        result = await rt.execute(WRITE, on_approval=approver)
    assert [name for name, _ in rec.deliveries] == (["close_ticket"] if sent else [])
    assert result.status == "completed" if sent else result.error["code"] == "write_declined"


async def test_a_plain_function_may_answer(tmp_path):
    rec = Recorder()
    async with _runtime(tmp_path, rec) as rt:
        result = await rt.execute(WRITE, on_approval=lambda pending: "approve")
    assert result.status == "completed" and [n for n, _ in rec.deliveries] == ["close_ticket"]


@pytest.mark.parametrize("answer", ["ok", ("approved", None), {"verdict": "approve"}, None, 1, ("approve", 5)])
async def test_any_other_answer_is_a_usage_error_and_nothing_is_sent(tmp_path, answer):
    """Not internal_error ("report this as a bug"), and never a silent decline ("ok" unpacked as ("o", "k"))."""
    rec = Recorder()

    async def approver(pending: dict) -> object:
        return answer

    async with _runtime(tmp_path, rec) as rt:
        result = await rt.execute(WRITE, on_approval=approver)
    assert rec.deliveries == []
    assert result.status == "failed"
    assert result.error["code"] == "invalid_approval", result.error
    assert "'approve' or 'decline'" in result.error["message"] and "not sent" in result.error["message"]

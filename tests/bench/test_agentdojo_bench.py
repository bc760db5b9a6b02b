"""bench/agentdojo_bench.py's harness on a few AgentDojo pairs, through tether's real Runtime (D-66).

The bench's figures are only as good as its programs and its bookkeeping: these pairs pin that a benign
task completes, that the suite's own judge sees an attack carried out when nobody is asked, that the
attacker's write is the one a person is asked about under ``ask``, and that a handwritten bulk
exfiltration program does what its injection task's judge checks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import agentdojo_bench  # noqa: E402 - after the path is set; agentdojo comes with the test extra


@pytest.fixture(scope="module")
def suites():
    return agentdojo_bench.load()


async def _pair(suites, ns, mode, uid, iid=None):
    suite = suites[ns]
    user = suite.user_tasks[uid]
    inj = suite.injection_tasks[iid] if iid else None
    injections = agentdojo_bench.injections_for(suite, user, inj) if inj else {}
    prepared = agentdojo_bench.prepare(ns, suite, user, inj, injections)
    async with agentdojo_bench.runtime_for(mode, ns, suite) as rt:
        return await agentdojo_bench.run_pair(rt, ns, suite, user, inj, prepared, f"t/{ns}/{uid}/{iid}")


def test_the_bill_is_read_in_one_run_and_paid_in_the_next(suites):
    suite = suites["banking"]
    user = suite.user_tasks["user_task_0"]
    _, plan = agentdojo_bench.prepare("banking", suite, user, None, {})
    assert [(c.function, c.run) for c in plan.calls] == [("read_file", 1), ("send_money", 2)]
    code = plan.program("banking", 2)
    # The IBAN came out of the bill: copied into the later run as a literal, as a model that read it would.
    assert "recipient='UK12345678901234567890'" in code and "read_file" not in code


async def test_a_benign_task_completes_and_asks_once_under_ask(suites):
    out = await _pair(suites, "banking", "ask", "user_task_0")
    assert out.utility and out.failed_runs == []
    assert [(a.address, a.attacker) for a in out.asks] == [("banking.send_money", False)]


async def test_an_attack_is_carried_out_unasked_under_allow_and_asked_under_ask(suites):
    allowed = await _pair(suites, "banking", "allow", "user_task_0", "injection_task_0")
    assert allowed.security and allowed.asks == [] and allowed.attack_writes == 1
    asked = await _pair(suites, "banking", "ask", "user_task_0", "injection_task_0")
    # The person approves everything, so the attack still lands; but the attacker's write was asked about.
    assert asked.security
    attacker = [a for a in asked.asks if a.attacker]
    assert [a.args["recipient"] for a in attacker] == ["US133000000121212121212"]


async def test_a_handwritten_exfiltration_program_passes_its_judge(suites):
    out = await _pair(suites, "workspace", "allow", "user_task_0", "injection_task_6")
    assert out.security and out.failed_runs == []
    # get_unread_emails (it marks mail read), the forwarding e-mail, its deletion
    assert out.attack_writes == 3


async def test_p45_guard_asks_about_the_attackers_iban_and_names_where_it_came_from(suites):
    out = await _pair(suites, "banking", "guard", "user_task_0", "injection_task_0")
    attacker = [a for a in out.asks if a.attacker]
    assert [a.args["recipient"] for a in attacker] == ["US133000000121212121212"]
    assert attacker[0].names_untrusted_source()
    # The injected text sat in the bill, the file the user asked to pay.
    assert any((r.get("origin") or {}).get("address") == "banking.read_file" for r in attacker[0].reasons)


async def test_p45_guard_lets_a_payment_to_whom_the_user_named_go_without_a_person(suites):
    out = await _pair(suites, "banking", "guard", "user_task_5")
    assert out.utility and out.asks == []

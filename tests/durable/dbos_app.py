"""A DBOS application whose workflow calls tether in a step (a helper process of tests/engine/test_durable_engines.py).

    dbos_app.py STORE_URL API_URL SYSDB_URL start|recover WORKFLOW_ID [approval]

The step runs one tether program with the key ``<workflow id>:<step id>``
(P-36): when DBOS runs the step again after a crash, tether answers with the
run the first attempt started, taken over from the dead process, instead of
running the program a second time. A run that pauses for approval ends the
step with the paused envelope; the workflow then waits for the decision on
``DBOS.recv_async("approval")`` and resumes the run in a step of its own.

``start`` starts the workflow and prints its result; ``recover`` launches DBOS,
whose startup recovery continues the workflows a killed process left pending,
and prints that workflow's result. The program's tools are the keyed payments
API's (tests/fixtures/keyed_api.json), declared to dedupe by idempotency key.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._sources.openapi import OpenAPISource
from tether._store import open_store

STORE_URL, API_URL, SYSDB_URL, MODE, WORKFLOW_ID = sys.argv[1:6]
APPROVAL = len(sys.argv) > 6 and sys.argv[6] == "approval"
SPEC = Path(__file__).parent.parent / "fixtures" / "keyed_api.json"

PROGRAM = """
import asyncio
import tools
a = await tools.shop.create_charge(order="ORDER-a", amount=10)
await asyncio.sleep(0.3)
b = await tools.shop.create_charge(order="ORDER-b", amount=20)
[a["charged"], b["charged"]]
"""


def program() -> str:
    return PROGRAM.replace("ORDER", WORKFLOW_ID)


async def runtime() -> tuple[Runtime, OpenAPISource]:
    source = OpenAPISource("shop", SPEC, base_url=API_URL, idempotency="key")
    await source.start()
    # With approval, each charge asks a person first; otherwise writes go out.
    policy = Policy(writes="ask") if APPROVAL else Policy(writes="allow")
    rt = Runtime(store=open_store(STORE_URL), tools=source.tools(), type_check=False, policy=policy,
                 lease_seconds=float(os.environ.get("TETHER_LEASE_SECONDS", "30")))
    return rt, source


@DBOS.step()
async def run_program() -> dict[str, Any]:
    # The key names this step of this workflow: the same on every attempt DBOS makes of it.
    key = f"{DBOS.workflow_id}:{DBOS.step_id}"
    rt, source = await runtime()
    async with rt:
        try:
            return (await rt.execute(program(), key=key)).to_dict()
        finally:
            await source.close()


@DBOS.step()
async def decide(run_id: str, seq: int, decision: str) -> dict[str, Any]:
    rt, source = await runtime()
    async with rt:
        try:
            return (await rt.resume(run_id, decision, seq=seq)).to_dict()
        finally:
            await source.close()


@DBOS.workflow()
async def payments() -> dict[str, Any]:
    envelope = await run_program()
    while envelope["status"] == "paused":
        # Says which write waits, so whoever decides can tell one pause from the next.
        await DBOS.set_event_async("paused", f"{envelope['run_id']}:{envelope['pending']['seq']}")
        decision = await DBOS.recv_async("approval", timeout_seconds=120)
        envelope = await decide(envelope["run_id"], envelope["pending"]["seq"], decision or "decline")
    return envelope


async def main() -> None:
    config: DBOSConfig = {"name": "tether-dbos-test", "system_database_url": SYSDB_URL, "log_level": "WARNING",
                          "notification_listener_polling_interval_sec": 0.05}
    DBOS(config=config)
    DBOS.launch()
    try:
        if MODE == "start":
            with SetWorkflowID(WORKFLOW_ID):
                handle = await DBOS.start_workflow_async(payments)
        else:
            handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
        result = await handle.get_result()
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)

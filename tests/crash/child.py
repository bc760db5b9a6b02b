"""The runtime process of the crash tests: start a run, or recover runs.

    child.py STORE_URL SERVER_URL start|recover|undo [KILL_AT]

KILL_AT = "<seam>:<n>" SIGKILLs this process right after the n-th commit of
that seam: record (a call journaled), sending (a write marked sending, also
for a re-send), outcome (a call's outcome recorded), snapshot (a snapshot
stored) — or right before it for delivered (a write's answer arrived, its
outcome is not yet recorded).

CRASH_API=declared|undeclared in the environment takes the tools from the
keyed payments API's OpenAPI document (tests/fixtures/keyed_api.json) at
SERVER_URL, with idempotency = "key" declared or not; otherwise they are
hand-written HTTP tools for tests/crash/delivery_server.py.

CRASH_PROGRAM=gather gathers each charge with two reads; CRASH_STREAM=1|0 sets the sandbox's streamed async
calls (D-80). CRASH_PROGRAM=undo runs three charges (each undone by a refund that dedupes by
key) and a transfer that asks: `start` pauses at the transfer, `undo` declines
it and rolls the run back (P-46), with the seam rollback (the plan recorded)
besides the others; CRASH_UNDO_UNKEYED=1 declares the refund not to dedupe by key.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx

from tether._engine.rules.policy import Policy
from tether._runtime import Runtime
from tether._sandbox.monty import SandboxPool
from tether._store.sqlite import SQLiteStore
from tether._tools.context import current_call
from tether._tools.model import Annotations, Tool
from tether._tools.undo import Undo

PROGRAM = """
import asyncio
import tools
total = 0
for i in range(1, 7):
    a, b = await asyncio.gather(tools.shop.get_item(id=i), tools.shop.get_item(id=i + 100))
    r = await tools.shop.CHARGE(order="order-" + str(i), amount=a["price"])
    total += a["price"]
{"total": total, "last": r["charged"]}
"""


# CRASH_PROGRAM=gather: each order's write gathered with reads, so calls are in flight at every seam.
GATHER_PROGRAM = """
import asyncio
import tools
total = 0
for i in range(1, 7):
    a, r, b = await asyncio.gather(tools.shop.get_item(id=i), tools.shop.CHARGE(order="order-" + str(i), amount=i),
                                   tools.shop.get_item(id=i + 100))
    total += a["price"]
{"total": total, "last": r["charged"]}
"""


# CRASH_PROGRAM=tasks: each order in a task of its own (asyncio.create_task), a read then its write, the tasks'
# calls interleaved, so a kill lands mid-task with other tasks' calls in flight (P-52).
TASKS_PROGRAM = """
import asyncio
import tools
async def order(i):
    a = await tools.shop.get_item(id=i)
    r = await tools.shop.CHARGE(order="order-" + str(i), amount=a["price"])
    return a["price"], r["charged"]
tasks = [asyncio.create_task(order(i)) for i in range(1, 7)]
done, waiting = await asyncio.wait(tasks)
results = [await t for t in tasks]
{"total": sum(p for p, _ in results), "last": results[-1][1]}
"""


UNDO_PROGRAM = """
import tools
for i in range(1, 4):
    await tools.shop.charge(order="undo-" + str(i), amount=i)
await tools.shop.transfer(amount=6)
"""


class KillingStore(SQLiteStore):
    def __init__(self, url: str, kill_at: str | None) -> None:
        super().__init__(url)
        self.seam, self.n = (kill_at.split(":")[0], int(kill_at.split(":")[1])) if kill_at else (None, 0)
        self.counts: dict[str, int] = {}

    def _hit(self, seam: str) -> None:
        self.counts[seam] = self.counts.get(seam, 0) + 1
        if seam == self.seam and self.counts[seam] == self.n:
            os.kill(os.getpid(), signal.SIGKILL)

    def record_call(self, call):
        super().record_call(call)
        self._hit("record")

    def record_calls(self, calls):
        super().record_calls(calls)
        # A batch of settled reads: their intents and outcomes at once.
        self._hit("record")
        self._hit("outcome")

    def update_run(self, run_id, expect_status, **fields):
        ok = super().update_run(run_id, expect_status, **fields)
        if isinstance(fields.get("pending"), dict) and "rollback" in fields["pending"]:
            self._hit("rollback")
        return ok

    def update_call(self, run_id, seq, expect_state, **fields):
        state = fields.get("state")
        if state == "sent":
            self._hit("delivered")
        ok = super().update_call(run_id, seq, expect_state, **fields)
        if state == "sending":
            self._hit("sending")
        elif state in ("sent", "done", "failed"):
            self._hit("outcome")
        return ok

    def put_snapshot(self, snapshot):
        super().put_snapshot(snapshot)
        self._hit("snapshot")


def shop_tools(base: str) -> list[Tool]:
    client = httpx.AsyncClient(base_url=base, timeout=5)

    async def refund(args):
        call = current_call()
        headers = {"idempotency-key": call.key} if call is not None else {}
        return (await client.post("/refund", json=args, headers=headers)).json()

    async def transfer(args):
        return (await client.post("/charge", json={"order": f"transfer-{args['amount']}", "amount": 0})).json()

    async def get_item(args):
        return (await client.get("/item", params={"id": args["id"]})).json()

    async def charge(args):
        return (await client.post("/charge", json=args)).json()

    return [
        Tool("shop", "get_item", "Read an item.", {"type": "object", "properties": {"id": {"type": "integer"}},
                                                   "required": ["id"]}, get_item,
             annotations=Annotations(read_only=True)),
        Tool("shop", "charge", "Charge an order (a write).",
             {"type": "object", "properties": {"order": {"type": "string"}, "amount": {"type": "integer"}},
              "required": ["order", "amount"]}, charge,
             undo=Undo("shop.refund", {"order": "result.charged"})),
        Tool("shop", "refund", "Refund an order (dedupes by idempotency key).",
             {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}, refund,
             idempotency="none" if os.environ.get("CRASH_UNDO_UNKEYED") else "key"),
        Tool("shop", "transfer", "Transfer money out (asks).",
             {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}, transfer),
    ]


async def main() -> None:
    store_url, server, mode = sys.argv[1:4]
    kill_at = sys.argv[4] if len(sys.argv) > 4 else None
    store = KillingStore(store_url, kill_at)
    api = os.environ.get("CRASH_API")
    if api:
        from tether._sources.openapi import OpenAPISource

        spec = Path(__file__).parent.parent / "fixtures" / "keyed_api.json"
        source = OpenAPISource("shop", spec, base_url=server, idempotency="key" if api == "declared" else "none")
        await source.start()
        tools, program = source.tools(), PROGRAM.replace("CHARGE", "create_charge")
    else:
        tools, program = shop_tools(server), PROGRAM.replace("CHARGE", "charge")
    if os.environ.get("CRASH_PROGRAM") == "undo":
        program = UNDO_PROGRAM
    elif os.environ.get("CRASH_PROGRAM") == "gather":
        program = GATHER_PROGRAM.replace("CHARGE", "create_charge" if api else "charge")
    elif os.environ.get("CRASH_PROGRAM") == "tasks":
        program = TASKS_PROGRAM.replace("CHARGE", "create_charge" if api else "charge")
    # CRASH_STREAM=1|0: the sandbox streams calls the program does not await at once, or not (D-80).
    stream = os.environ.get("CRASH_STREAM")
    pool = SandboxPool(stream_async_calls=stream == "1") if stream is not None else None
    policy = Policy(writes="allow", rules=[{"match": "shop.transfer", "action": "ask"}])
    rt = Runtime(store=store, tools=tools, type_check=False, policy=policy,
                 lease_seconds=float(os.environ.get("CRASH_LEASE_SECONDS", "0.3")), checkpoint_every_calls=4, pool=pool)
    async with rt:
        if mode == "start":
            result = await rt.execute(program)
            out = [result.to_dict()]
        elif mode == "undo":
            (run,) = rt.store.list_runs()
            out = [(await rt.resume(run.run_id, "decline_and_undo", seq=(run.pending or {})["seq"])).to_dict()]
        else:
            out = [r.to_dict() for r in await rt.recover()]
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)

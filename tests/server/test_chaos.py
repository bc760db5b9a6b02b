"""Chaos: three replicas on one Postgres behind a round-robin proxy, one SIGKILLed under load.

At full scale by default: CHAOS_CLIENTS clients (100) for CHAOS_SECONDS
(60 s), replica 0 SIGKILLed at CHAOS_KILL_AT (half-way). Each client loops
over one action at a time, each on a new connection (no stickiness of any
kind; a quarter of the clients speak the 2025-11-25 era):

- read: a program listing tickets;
- write: a write under `allow` (0.2 s on the wire);
- ask: a write under `ask`, approved by another connection (the proxy's next
  replica) with `resume`;
- timer: a 1.5 s durable timer (parked, woken by a replica's runner);
- cell: a cell that emits, followed with `cell_wait`;
- signal: a cell parked on `wait_for_signal`, signalled at once by another
  client (often while the run is still parking) and followed through another
  connection; it writes what it got;
- wait: a run parked on `wait_for`, resolved by another client with the key
  the first got, then a write;
- terminate: a cell ended by another connection with `cell_terminate` while
  it runs on, or while it is about to park on a signal nobody sends.

The other client that signals and resolves uses the Python API in its own
process on the store (this one; MCP has no tool for it), as `tether runs
signal` and `tether waits resolve` would. Half the time it continues a parked
run itself, as they do; half the time it only records the resolution and a
replica's runner continues the run (told by a notice). A resolution that lands
while the run is still parking is seen by the process parking it.

Afterwards: every run the test started has ended or is legitimately paused
or waiting (its decision or resolution was lost with a call the kill cut
off); no write reached the ledger (an O_APPEND file the tool writes, outside
tether) twice, and every write journaled sent reached it; every unknown write
is reported `write_outcome_unknown`; every call ended with a result, a named
error (`overloaded` among them) or, for a call in flight on the killed replica
only, a transport error — none hung. Every run-starting request carries its
action's tag as its run key (P-36), and one cut off by the kill is sent again
with that key on a new connection: no tag has two runs, and every retry that
is answered names the run its key started. Throughput and p50/p99 are printed
(bench/README.md has the figures).
"""

from __future__ import annotations

import os
import random
import resource
import signal
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import anyio
import pytest

from chaos_proxy import ProxyProcess
from replicas import ReplicaSet, connect
from tether._app import open_runtime
from tether._store import open_store
from tether.errors import TetherError

pytestmark = pytest.mark.slow

CLIENTS = int(os.environ.get("CHAOS_CLIENTS", "100"))
SECONDS = float(os.environ.get("CHAOS_SECONDS", "60"))
REPLICAS = int(os.environ.get("CHAOS_REPLICAS", "3"))
KILL = os.environ.get("CHAOS_KILL", "1") == "1" and REPLICAS > 1
KILL_AT = float(os.environ.get("CHAOS_KILL_AT", str(SECONDS / 2)))
CALL_LIMIT = 120.0  # one call (or connecting) taking longer than this is a hang
RETRIES = 5  # a run-starting request cut off by the kill is sent again with its key this many times at most
SETTLE_LIMIT = 180.0  # for what the clients left running to end once they stop
KINDS = ("read", "write", "ask", "timer", "cell", "signal", "wait", "terminate")
RUN_STATUSES = {"completed", "failed", "paused", "waiting", "running", "terminated", "cancelled"}


@dataclass
class Call:
    kind: str
    tool: str
    tag: str
    t0: float
    t1: float = 0.0
    outcome: str = ""  # a run/observation status, "error:<code>", "transport:<exception>" or "hang"


@dataclass
class Tally:
    marker: str
    calls: list[Call] = field(default_factory=list)
    cut_off: set[str] = field(default_factory=set)  # tags of actions a transport error interrupted
    resolved: set[str] = field(default_factory=set)  # run ids another client resolved or signalled
    undecided: set[str] = field(default_factory=set)  # tags of asks whose resume stayed overloaded
    # Run-starting requests retried with their key after a transport error: tag -> (tries, the answer's
    # outcome, the run id it named, or None if every try was cut off too).
    retried: dict[str, tuple[int, str, str | None]] = field(default_factory=dict)
    kill_time: float | None = None

    async def call(self, client, kind: str, tool: str, args: dict, tag: str):
        return (await self._call(client, kind, tool, args, tag))[0]

    async def start(self, url: str, mode: str, client, kind: str, tool: str, args: dict, tag: str):
        """A run-starting call (execute, cell_start) with the action's tag as its key (P-36). Cut off by a
        transport error, it is sent again with the same key on a new connection, as a client that cannot
        know whether its program ran would: the answer must be the run the first request started."""
        args = {**args, "key": tag}
        out, c = await self._call(client, kind, tool, args, tag)
        tries = 0
        while c.outcome.startswith("transport:") and tries < RETRIES:
            tries += 1
            await anyio.sleep(0.2 * tries)
            try:
                async with connect(url, mode, headers={"x-chaos-tag": tag}) as again:
                    out, c = await self._call(again, kind, tool, args, tag)
            except Exception as exc:  # connecting failed: try again
                c = Call(kind, "connect", tag, time.monotonic(), time.monotonic(), f"transport:{describe(exc)}")
                self.calls.append(c)
        if tries:
            named = (out or {}).get("run_id") or (out or {}).get("cell_id")
            self.retried[tag] = (tries, c.outcome, named if not c.outcome.startswith("transport:") else None)
        return out

    async def _call(self, client, kind: str, tool: str, args: dict, tag: str):
        c = Call(kind, tool, tag, time.monotonic())
        self.calls.append(c)
        try:
            with anyio.fail_after(CALL_LIMIT):
                r = await client.call_tool(tool, args)
        except TimeoutError:
            c.outcome, c.t1 = "hang", time.monotonic()
            return None, c
        except Exception as exc:  # the replica died under the call, or its stream was cut
            c.outcome, c.t1 = f"transport:{describe(exc)}", time.monotonic()
            self.cut_off.add(tag)
            return None, c
        except BaseException:  # cancelled: the client's connection failed around it (one_client records why)
            c.outcome, c.t1 = "transport:cancelled", time.monotonic()
            self.cut_off.add(tag)
            raise
        c.t1 = time.monotonic()
        sc = r.structured_content or {}
        code = (sc.get("error") or {}).get("code") if sc.get("status") == "error" else None
        c.outcome = f"error:{code}" if sc.get("status") == "error" else str(sc.get("status"))
        return sc, c

    def answered(self) -> list[Call]:
        return [c for c in self.calls if c.outcome != "hang" and not c.outcome.startswith("transport:")]


def program(marker: str, tag: str, body: str) -> str:
    return f"# {marker} {tag}\n{body}"


class OtherClient:
    """Signals and resolves waits from a process of its own on the store (the Python API)."""

    def __init__(self, rt, tally: Tally) -> None:
        self.rt, self.tally = rt, tally

    async def settle(self, kind: str, tag: str, run_id: str, how) -> None:
        c = Call(kind, "signal" if kind == "signal" else "resolve_wait", tag, time.monotonic())
        self.tally.calls.append(c)
        try:
            with anyio.fail_after(CALL_LIMIT):
                out = await how()
        except TimeoutError:
            c.outcome, c.t1 = "hang", time.monotonic()
            return
        except TetherError as exc:
            c.outcome, c.t1 = f"error:{exc.code}", time.monotonic()
            return
        except Exception as exc:  # noqa: BLE001 - fails the test below, saying what it was
            c.outcome, c.t1 = f"raised:{type(exc).__name__}: {exc}", time.monotonic()
            return
        c.t1 = time.monotonic()
        c.outcome = out["status"]  # accepted (the run continued here if it was parked) or already_resolved
        self.tally.resolved.add(run_id)


async def follow(tally: Tally, url: str, mode: str, kind: str, tag: str, obs: dict | None, stop_by: float) -> None:
    """cell_wait on a new connection (another replica) until the cell ends or stops on something to decide."""
    if not obs or "cell_id" not in obs:
        return
    async with connect(url, mode, headers={"x-chaos-tag": tag}) as c:
        while obs and (obs["status"] == "running" or (obs["status"] == "paused" and kind == "signal")):
            if time.monotonic() > stop_by:
                return  # the settling check below sees how it ended
            obs = await tally.call(c, kind, "cell_wait", {"cell_id": obs["cell_id"], "after": obs["cursor"],
                                                          "timeout_ms": 2000}, tag)


async def action(n: int, i: int, kind: str, url: str, mode: str, tally: Tally, other: OtherClient,
                 stop_at: float) -> float:
    """One client action; returns how long to back off (an `overloaded` answer's retry_after_ms)."""
    tag = f"{tally.marker}-{n}-{i}"
    m = tally.marker
    out = None
    async with connect(url, mode, headers={"x-chaos-tag": tag}) as c:
        if kind == "read":
            out = await tally.start(url, mode, c, kind, "execute", {"code": program(m, tag,
                                   "import tools\nlen(await tools.helpdesk.list_tickets(status='open'))")}, tag)
        elif kind == "write":
            out = await tally.start(url, mode, c, kind, "execute", {"code": program(m, tag,
                                   f"import tools\nawait tools.ledger.write(tag='{tag}', seconds=0.2)")}, tag)
        elif kind == "ask":
            out = await tally.start(url, mode, c, kind, "execute", {"code": program(m, tag,
                                   f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')")}, tag)
            if out and out.get("status") == "paused":
                # Decided on a new connection: the proxy's next replica, not the one that paused it.
                # An `overloaded` resume is tried again after its retry_after_ms, as a client would.
                args = {"run_id": out["run_id"], "decision": "approve", "seq": out["pending"]["seq"]}
                while True:
                    async with connect(url, mode, headers={"x-chaos-tag": tag}) as decider:
                        done = await tally.call(decider, kind, "resume", args, tag)
                    wait = retry_after(done)
                    if wait and time.monotonic() > stop_at + 30:
                        tally.undecided.add(tag)  # overloaded to the end: legitimately still paused
                    if not wait or tag in tally.undecided:
                        break
                    await anyio.sleep(wait * (0.5 + random.random()))
        elif kind == "timer":
            out = await tally.start(url, mode, c, kind, "execute", {"code": program(m, tag,
                                   "import asyncio\nawait asyncio.sleep(1.5)\n'woke'")}, tag)
        elif kind == "cell":
            out = await tally.start(url, mode, c, kind, "cell_start", {"code": program(m, tag,
                                   "import asyncio\nemit(1)\nawait asyncio.sleep(0.2)\nemit(2)\n'celled'"),
                                   "yield_after_ms": 100}, tag)
            await follow(tally, url, mode, kind, tag, out, stop_at + 30)
        elif kind == "signal":
            out = await tally.start(url, mode, c, kind, "cell_start", {"code": program(m, tag,
                                   "import tools\nemit('ready')\nv = await wait_for_signal('go')\n"
                                   f"await tools.ledger.write(tag='{tag}-' + v)\nv"), "yield_after_ms": 50}, tag)
            if out and "cell_id" in out:
                run_id = out["cell_id"]
                if i % 2:  # continued by the process that signals, if parked (as `tether runs signal`) ...
                    await other.settle(kind, tag, run_id, lambda: other.rt.signal(run_id, "go", "now"))
                else:  # ... or by a replica's runner, told by a notice
                    key = other.rt.engine.waits.key(run_id, "signal:go")
                    await other.settle(kind, tag, run_id, lambda: other.rt.resolve_wait(key, "now", continue_run=False))
                await follow(tally, url, mode, kind, tag, out, stop_at + 30)
        elif kind == "wait":
            out = await tally.start(url, mode, c, kind, "execute", {"code": program(m, tag,
                                   "import tools\nv = await wait_for('answer', timeout=600)\n"
                                   f"await tools.ledger.write(tag='{tag}-' + v['ok'])\nv")}, tag)
            if out and out.get("status") == "waiting":
                key = out["pending"]["key"]
                await other.settle(kind, tag, out["run_id"],
                                   lambda: other.rt.resolve_wait(key, {"ok": "yes"}, continue_run=bool(i % 2)))
        else:  # terminate: a cell that runs on, or one about to park on a signal nobody sends
            body = ("import asyncio\nfor i in range(20):\n    emit(i)\n    await asyncio.sleep(0.5)\n'not terminated'"
                    if i % 2 else "import asyncio\nemit(0)\nawait asyncio.sleep(0.3)\nawait wait_for_signal('never')")
            out = await tally.start(url, mode, c, kind, "cell_start", {"code": program(m, tag, body), "yield_after_ms": 100}, tag)
            if out and out.get("status") in ("running", "paused"):
                async with connect(url, mode, headers={"x-chaos-tag": tag}) as stopper:
                    await tally.call(stopper, kind, "cell_terminate", {"cell_id": out["cell_id"]}, tag)
    return retry_after(out)


def retry_after(out: dict | None) -> float:
    """Seconds an `overloaded` answer asks the client to wait; 0 for any other."""
    err = (out or {}).get("error") or {}
    if out and out.get("status") == "error" and err.get("code") == "overloaded":
        return (err.get("details") or {}).get("retry_after_ms", 500) / 1000
    return 0.0


async def one_client(n: int, url: str, tally: Tally, other: OtherClient, stop_at: float) -> None:
    rng = random.Random(n)
    mode = "legacy" if n % 4 == 3 else "auto"  # a quarter in the 2025-11-25 era (stateless replicas)
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        kind = KINDS[(n + i) % len(KINDS)]  # every kind from every client, in turn
        tag = f"{tally.marker}-{n}-{i}"
        backoff = 0.0
        t0 = time.monotonic()
        try:
            with anyio.fail_after(CALL_LIMIT * 3):
                backoff = await action(n, i, kind, url, mode, tally, other, stop_at)
        except TimeoutError:
            tally.calls.append(Call(kind, "connect", tag, t0, time.monotonic(), "hang"))
        except Exception as exc:  # connecting failed (initialize went to a dying replica)
            tally.calls.append(Call(kind, "connect", tag, t0, time.monotonic(), f"transport:{describe(exc)}"))
            tally.cut_off.add(tag)
        if backoff:
            await anyio.sleep(backoff * (0.5 + rng.random()))


def describe(exc: BaseException) -> str:
    """An exception's type and message, with those it groups: a client's connection fails as an ExceptionGroup."""
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}[{','.join(sorted({describe(e) for e in exc.exceptions}))}]"
    return f"{type(exc).__name__}({str(exc)[:160]})"


def cpu_seconds(pid: int | str) -> float:
    """User + system CPU time of a live process, from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def test_replicas_under_load_one_sigkilled(tmp_path, pg_url, monkeypatch):
    rs = ReplicaSet(tmp_path / "rs", pg_url, REPLICAS, server_extra="stateless_http = true", lease_seconds=10)
    proxy = ProxyProcess([r.port for r in rs.replicas], tmp_path / "rs" / "proxy.log")
    tally = Tally(f"chaos{uuid.uuid4().hex[:8]}")
    # The other client's process: the replicas' tools, config and ledger, a home of its own.
    for k in ("TETHER_STORE_URL", "LEDGER", "TETHER_LEASE_SECONDS"):
        monkeypatch.setenv(k, rs.env[k])
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "rs" / "home-client"))
    try:
        async with open_runtime(config_path=rs.root / "tether.toml", tools=rs.tools_args()[1::2],
                                store_url=pg_url) as rt:
            other = OtherClient(rt, tally)
            t0 = time.monotonic()
            stop_at = t0 + SECONDS

            victim = rs.replicas[0]
            at_kill: dict = {}

            def look(store) -> tuple[list, list]:
                """The runs the victim holds, and those with a write on the wire."""
                runs = [r for r in store.list_runs(status="running", limit=100_000)
                        if f":{victim.proc.pid}:" in (r.owner or "")]
                return runs, [r for r in runs if any(c.kind == "write" and c.state == "sending"
                                                     for c in store.get_calls(r.run_id))]

            async def killer():
                # At KILL_AT, or soon after: when a write is on the wire there (the case that must end
                # write_outcome_unknown, never sent twice), else when it holds any run at all.
                await anyio.sleep(KILL_AT)
                t = time.monotonic()
                store = open_store(pg_url)
                try:  # looked at from a thread of its own: the clients' event loop is not held up
                    while True:
                        runs, on_wire = await anyio.to_thread.run_sync(look, store)
                        if on_wire or (runs and time.monotonic() > t + 5) or time.monotonic() > t + 20:
                            break
                        await anyio.sleep(0.05)
                finally:
                    store.close()
                tally.kill_time = time.monotonic()
                victim.proc.send_signal(signal.SIGKILL)
                at_kill.update(held=[r.run_id for r in runs], on_wire=[r.run_id for r in on_wire])
                seen = await anyio.to_thread.run_sync(proxy.stats)
                at_kill.update(served=seen["served"].get(victim.port, 0),
                               in_flight=seen["in_flight"].get(victim.port, 0),
                               all_served=seen["served"], all_in_flight=seen["in_flight"], up=seen["up"])

            lag: list[float] = []
            lag_at: list[float] = []

            async def lag_meter():
                # How late this process's event loop runs a 0.1 s sleep: the load generator's own delay,
                # which every latency below includes.
                while time.monotonic() < stop_at:
                    t = time.monotonic()
                    await anyio.sleep(0.1)
                    lag.append(time.monotonic() - t - 0.1)
                    lag_at.append(t - t0)

            async with anyio.create_task_group() as tg:
                if KILL:
                    tg.start_soon(killer)
                tg.start_soon(lag_meter)
                for n in range(CLIENTS):
                    tg.start_soon(one_client, n, proxy.url, tally, other, stop_at)
            elapsed = time.monotonic() - t0
            cpu = {"test process": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
                   "proxy": cpu_seconds(proxy.proc.pid)}
            cpu.update({f"replica {i}": cpu_seconds(r.proc.pid) for i, r in enumerate(rs.replicas)
                        if r.proc.poll() is None})

            # What the clients left: timers and continuations end; the dead replica's runs are taken over
            # (same host: at once). Waiting or paused may stay only what nobody will decide or resolve.
            store = open_store(pg_url)
            try:
                deadline = time.monotonic() + SETTLE_LIMIT
                while True:
                    runs = [r for r in store.list_runs(limit=100_000) if tally.marker in r.program]
                    left = [(r.run_id, r.status, r.owner, r.pending) for r in runs if unsettled(store, r)]
                    if not left or time.monotonic() > deadline:
                        break
                    await anyio.sleep(0.3)
                calls = {r.run_id: store.get_calls(r.run_id) for r in runs}
            finally:
                store.close()
            seen = proxy.stats()
    finally:
        proxy.stop()
        rs.stop()
    for r in rs.replicas[1 if KILL else 0:]:
        assert r.proc.returncode == 0, r.log.read_text()[-3000:]
    if KILL:
        assert rs.replicas[0].proc.returncode == -signal.SIGKILL

    answered = tally.answered()
    latencies = [c.t1 - c.t0 for c in answered]
    outcomes = Counter(c.outcome for c in tally.calls)
    statuses = Counter(r.status for r in runs)
    print(f"\nchaos: {REPLICAS} replicas, {CLIENTS} clients, {elapsed:.1f} s, kill={KILL}: {len(answered)} calls "
          f"answered ({len(answered) / elapsed:.1f}/s), p50 {statistics.median(latencies) * 1000:.0f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms; {len(runs)} runs; "
          f"outcomes {dict(outcomes)}; "
          f"statuses {dict(statuses)}; by kind "
          f"{ {k: dict(Counter(r.status for r in runs if kind_of(r) == k)) for k in KINDS} }; "
          f"replica 0 at the kill: {at_kill.get('served')} requests served, {at_kill.get('in_flight')} in flight, "
          f"{len(at_kill.get('held', []))} runs held; {at_kill}; CPU s {({k: round(v, 1) for k, v in cpu.items()})}")

    by_call: dict[str, list[float]] = {}
    for c in answered:
        by_call.setdefault(f"{c.kind}/{c.tool}", []).append(c.t1 - c.t0)
    took = [r.updated_at - r.created_at for r in runs if kind_of(r) in ("read", "write") and r.status == "completed"]
    print(f"reads and writes, created to ended in the store: p50 {statistics.median(took) * 1000:.0f} ms, "
          f"p99 {percentile(took, 0.99) * 1000:.0f} ms (n={len(took)})")
    print(f"load generator's event loop late by p50 {statistics.median(lag) * 1000:.0f} ms, "
          f"p99 {percentile(lag, 0.99) * 1000:.0f} ms, max {max(lag) * 1000:.0f} ms "
          f"at +{lag_at[lag.index(max(lag))]:.1f} s (the kill at +{(tally.kill_time or t0) - t0:.1f} s)")
    print(f"proxy: served {seen['served']}, answers >= 400 {seen['errors']}")
    print("p50 by call: " + ", ".join(f"{k} {statistics.median(v) * 1000:.0f} ms (n={len(v)})"
                                      for k, v in sorted(by_call.items())))
    # Never a hang; every call answered with a status or a named error; a transport error only for a
    # call on the wire when the replica died (the proxy routes by /readyz and skips a refusing one).
    assert not [c for c in tally.calls if c.outcome == "hang"], [c for c in tally.calls if c.outcome == "hang"]
    for c in answered:
        assert c.outcome in RUN_STATUSES | {"accepted", "already_resolved"} or (
            c.outcome.startswith("error:") and c.outcome != "error:None"), c
    lost = [c for c in tally.calls if c.outcome.startswith("transport:")]
    assert KILL or not lost, lost
    for c in lost:  # each one a request the killed replica failed under, after the kill
        assert (c.tag, victim.port) in seen["broken"] and c.t1 >= tally.kill_time, (c, tally.kill_time)
    assert {port for _, port in seen["broken"]} <= ({victim.port} if KILL else set()), seen["broken"]

    if KILL:  # the kill hit a replica at work
        assert at_kill["served"] > 0 and at_kill["held"], at_kill

    assert not left, left  # still on their way SETTLE_LIMIT after the clients stopped

    # The whole mix ran, and ran to the end.
    assert {kind_of(r) for r in runs if r.status == "completed"} >= set(KINDS) - {"terminate"}
    assert any(r.status == "cancelled" for r in runs if kind_of(r) == "terminate")

    ledger = Counter(t for t in rs.tags() if t.startswith(tally.marker))
    assert all(v == 1 for v in ledger.values()), [t for t, v in ledger.items() if v > 1]  # never twice
    checked = Counter()
    for run in runs:
        tag = tag_of(run)
        assert run.status in ("completed", "failed", "paused", "waiting", "cancelled"), (run.run_id, run.status)
        if run.status == "failed":
            assert isinstance((run.error or {}).get("code"), str), run.error  # a named error
        if run.status in ("paused", "waiting"):
            # Only a run whose decision or resolution never came: its client's call was cut off by the kill.
            assert (tag in tally.cut_off or tag in tally.undecided) and run.run_id not in tally.resolved, (
                run.run_id, run.status, tag)
        if run.status == "cancelled":
            assert kind_of(run) == "terminate", (run.run_id, run.error)
        for c in calls[run.run_id]:
            if c.kind != "write":
                continue
            sent = ledger[c.args["tag"]] if "tag" in c.args else None
            checked[c.state] += 1
            if c.state == "sent":
                assert sent == 1, (run.run_id, c.args)  # journaled sent: delivered, once
            if c.state == "unknown":
                assert run.status == "failed" and run.error["code"] == "write_outcome_unknown", run.error
            if sent and run.status == "failed":
                assert run.error["code"] == "write_outcome_unknown", run.error  # sent, outcome lost: said so
    print(f"writes by journal state: {dict(checked)}; ledger lines {sum(ledger.values())}")
    assert checked["sent"] > 0

    # Retries (P-36): every action's run-starting request carried its tag as the key, so no tag has two
    # runs, and every retry that was answered named the one run its key started.
    per_tag = Counter(tag_of(r) for r in runs)
    assert not [t for t, n in per_tag.items() if n > 1], [t for t, n in per_tag.items() if n > 1]
    by_tag = {tag_of(r): r for r in runs}
    answered_retries = {t: v for t, v in tally.retried.items() if v[2] is not None}
    for tag, (_tries, outcome, named) in answered_retries.items():
        assert tag in by_tag and by_tag[tag].run_id == named and by_tag[tag].run_key == tag, (tag, outcome, named)
    print(f"retried with their key: {len(tally.retried)} requests ({sum(v[0] for v in tally.retried.values())} "
          f"tries), {len(answered_retries)} answered with their run, outcomes "
          f"{dict(Counter(v[1] for v in tally.retried.values()))}; runs per key: max {max(per_tag.values())}")


def tag_of(run) -> str:
    return run.program.split("\n", 1)[0].split()[-1]


def kind_of(run) -> str:
    body = run.program
    for kind, mark in (("terminate", "range(20)"), ("terminate", "'never'"), ("signal", "wait_for_signal"),
                       ("wait", "wait_for("), ("cell", "emit(1)"), ("timer", "sleep(1.5)"), ("ask", "guarded_write"),
                       ("write", "ledger.write"), ("read", "list_tickets")):
        if mark in body:
            return kind
    return "?"


def unsettled(store, run) -> bool:
    """Still on its way: running, queued, a timer not yet woken, or parked on a wait settled meanwhile
    (a replica's runner continues it: told by a notice, or finding it in its scan)."""
    if run.status in ("running", "queued"):
        return True
    if run.status != "waiting":
        return False
    pending = run.pending or {}
    if pending.get("kind") == "sleep":
        return True
    wait = store.get_wait(pending["key"]) if pending.get("key") else None
    return wait is not None and wait.status != "pending"

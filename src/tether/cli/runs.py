"""`tether run`, `resume`, `start`, `worker`, `recover` and `tether runs ...`: a run from start to end."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, NoReturn

from tether._engine.attempt.redaction import shown_args
from tether._store.states import RunStatus
from tether._tools.shown import escape, show_call
from tether.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PAUSED,
    EXIT_TIMED_OUT,
    abs_path,
    actor_for,
    add_acting_as,
    add_common,
    call_text,
    ensure_worker,
    home_of,
    json_arg,
    local_user,
    open_rt,
    owned_elsewhere,
    print_json,
    print_pause,
    print_result,
    print_wait_outcome,
    read_program,
    run_setup,
)
from tether.errors import RunNotFound


async def _ask_inline(pending: dict) -> tuple[str, str | None]:
    from tether._engine.lineage.why import why_lines

    # Why lineage made it wait (writes = "guard", P-45), before the question.
    why = "".join(f"  why: {line}\n" for line in why_lines(pending.get("reasons") or (), pending.get("args") or {}))
    prompt = f"{why}Allow write {show_call(str(pending['address']), shown_args(pending)).line()}? [y/N] "
    answer = await asyncio.to_thread(input, prompt)
    return ("approve", None) if answer.strip().lower() in ("y", "yes") else ("decline", "declined at the terminal")


async def _ask_question(question: dict) -> dict:
    """An upstream tool's form, asked field by field at the terminal."""
    schema = question.get("schema") or {}
    if question.get("mode") != "form":
        return {"action": "decline"}
    # The server's words, not escapes that drive the terminal (D-91).
    print(f"{question['address']} asks: {escape(str(question['message']), keep_lines=True)}")
    content: dict = {}
    for name, prop in (schema.get("properties") or {}).items():
        raw = await asyncio.to_thread(input, f"  {escape(str(prop.get('title') or name))}: ")
        kind = prop.get("type")
        try:
            content[name] = (int(raw) if kind == "integer" else float(raw) if kind == "number"
                             else raw.strip().lower() in ("y", "yes", "true", "1") if kind == "boolean" else raw)
        except ValueError:
            return {"action": "decline"}
    sure = await asyncio.to_thread(input, "Send these answers? [y/N] ")
    return {"action": "accept", "content": content} if sure.strip().lower() in ("y", "yes") else {"action": "decline"}


async def cmd_run(args: argparse.Namespace) -> int:
    from tether._app import resolve_tool_spec

    code = read_program(args.program)
    tools = [resolve_tool_spec(t) for t in args.tools]
    async with open_rt(args, tools, report=True) as rt:
        interactive = sys.stdin.isatty() and sys.stdout.isatty() and not args.no_prompt and not args.json
        approver = None
        if interactive:
            async def approver(pending: dict) -> tuple[str, str | None]:
                return await _ask_inline(pending)
            # Recorded with each decision taken at the prompt (P-29).
            approver.actor, approver.via = local_user(), "cli"  # type: ignore[attr-defined]
            # The person at this terminal holds the store: the operator, who may decide
            # writes whose rule requires a signed-in approver.
            approver.signed_in = True  # type: ignore[attr-defined]
        result = await rt.execute(code, on_approval=approver,
                                  on_question=_ask_question if interactive else None,
                                  meta={"tools": tools, "config": abs_path(args.config)}, key=args.key)
    if result.status == RunStatus.WAITING and result.expires_at is not None:
        # A timer or a timeout must fire with nobody watching: make sure a worker will.
        ensure_worker(args, tools)
    return print_result(result, args.json)


def _print_lineage(call: dict[str, Any]) -> None:
    """A call's lineage in the timeline (writes = "guard", P-45): an untrusted read, or why a write asked."""
    from tether._engine.lineage.why import why_lines

    lineage = call.get("lineage")
    if not isinstance(lineage, dict):
        return
    if "asked" in lineage:
        lines = why_lines(lineage.get("reasons") or (), call.get("args") or {})
        if lineage["asked"]:
            for line in lines:
                print(f"       asked: {line}")
        else:
            print("       lineage: no destination from untrusted data")
    if "trust" in lineage:
        print(f"       {lineage['trust']} result, {lineage.get('marks', 0)} values kept to match later writes")


async def cmd_resume(args: argparse.Namespace) -> int:
    decision = ("approve" if args.approve else "decline" if args.decline else
                "decline_and_undo" if args.decline_and_undo else "cancel")
    tools, config, sources = run_setup(args)
    args.config = config
    actor, principal = actor_for(args), args.acting_as
    async with open_rt(args, tools, sources=sources) as rt:
        try:
            return await _resume(args, rt, decision, actor, principal)
        except RunNotFound as exc:
            raise owned_elsewhere(rt.store, args.run_id, principal, exc) from None


async def _resume(args: argparse.Namespace, rt: Any, decision: str, actor: str, principal: str | None) -> int:
    seqs = list(args.seq or [])
    if args.all:
        seqs += [w.seq for w in rt.pending(args.run_id, principal=principal) if w.decision is None]
    elif not seqs and decision != "cancel" and sys.stdin.isatty() and sys.stdout.isatty() and not args.json:
        # No seq: the person at the terminal is shown each write and says which (P-28).
        waiting = rt.pending(args.run_id, principal=principal)
        seqs = await _confirm_each(waiting, decision)
        if waiting and not seqs:
            print("nothing decided")
            return EXIT_PAUSED
    if seqs:
        result = await rt.decide(args.run_id, {s: (decision, args.reason) for s in seqs}, principal=principal,
                                 actor=actor, via="cli")
    else:
        result = await rt.resume(args.run_id, decision, args.reason, principal=principal, actor=actor,
                                 via="cli")
    return print_result(result, args.json)


async def _confirm_each(pending: list, decision: str) -> list[int]:
    chosen = []
    for w in pending:
        if w.decision is None:
            answer = await asyncio.to_thread(input, f"{decision} {call_text(w.to_dict())}? [y/N] ")
            if answer.strip().lower() in ("y", "yes"):
                chosen.append(w.seq)
    return chosen


async def cmd_runs_list(args: argparse.Namespace) -> int:
    from tether._config import load_config
    from tether._store import open_store

    store = open_store(load_config(args.config).store.url)
    try:
        runs = await store.aio.list_runs(status=args.status, limit=args.limit)
    finally:
        store.close()
    rows: list[dict[str, Any]] = [{"run_id": r.run_id, "status": r.status, "created_at": r.created_at, "updated_at": r.updated_at,
             "pending": (r.pending or {}).get("address"), "error": (r.error or {}).get("code")} for r in runs]
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        print("no runs")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        extra = f" waits on {r['pending']}" if r["pending"] else (f" [{r['error']}]" if r["error"] else "")
        print(f"{r['run_id']}  {r['status']:<9}  {when}{extra}")
    return EXIT_OK


async def cmd_runs_show(args: argparse.Namespace) -> int:
    from tether._config import load_config
    from tether._engine.inspect import run_timeline
    from tether._server.approvals import run_links
    from tether._store import open_store

    config = load_config(args.config)
    store = open_store(config.store.url)
    try:
        data = run_timeline(store, args.run_id)
        run = await store.aio.get_run(args.run_id)
        # Approval links need [server] public_url: where people reach the server.
        data["approval_links"] = []
        if run is not None and run.status in (RunStatus.PAUSED, RunStatus.WAITING):
            from tether._runtime import Runtime

            # A runtime over the store only (no tools, no workers started): it reads the pause, and
            # recomputes a parked wait's key, of which the record keeps only the digest (D-33).
            rt = Runtime(store=store)
            if run.status == RunStatus.PAUSED:
                data["approval_links"] = run_links(rt, config.server.public_url, run)
            else:
                data["outcome"] = rt.engine.recorded(run).to_dict()
                data["pending"] = data["outcome"].get("pending") or data["pending"]
    finally:
        store.close()
    if args.json:
        print_json(data)
        return EXIT_OK
    named = f", {data['principal_name']}" if data.get("principal_name") else ""
    print(f"run {data['run_id']}: {data['status']} (principal {data.get('principal') or 'local'}{named})")
    print("program:")
    for i, line in enumerate(data["program"].splitlines(), 1):
        print(f"  {i:>3} | {escape(line)}")
    print("calls:")
    for c in data["calls"]:
        ms = f"{c['ms']:.1f} ms" if c.get("ms") is not None else "-"
        beside = (f"  undone by #{c['undone_by']}" if "undone_by" in c else
                  f"  undoes #{c['undoes']}" if "undoes" in c else "")
        print(f"  #{c['seq']:<3} {c['kind']:<5} {escape(str(c['address'])):<32} {c['state']:<9} {ms}{beside}")
        _print_lineage(c)
    for d in data.get("decisions") or []:
        why = f" ({escape(str(d['reason']))})" if d.get("reason") else ""
        # An ended run's undo (seq 0) decides the run, not a call; who decided may be a name its user chose.
        what = d["decision"] if d.get("seq") == 0 else f"call {d['seq']} {d['decision']}"
        print(f"decided: {what}{why} by {escape(str(d.get('actor')))} via {escape(str(d.get('via')))}")
    if data.get("pending") and data["status"] == RunStatus.PAUSED:
        print_pause(data["run_id"], data["pending"], owner=data.get("principal"), expires_at=data.get("expires_at"))
    elif data.get("pending") and "rollback" in data["pending"]:
        print("rolling back: its writes are being undone, newest first")
    elif data.get("pending"):
        print(f"pending: call {data['pending']['seq']} "
              f"{escape(str(data['pending'].get('address') or data['pending'].get('name')))}")
        if data["pending"].get("kind") == "wait" and data["pending"].get("key"):
            print(f"  key: {data['pending']['key']}")
    running = data["status"] in (RunStatus.RUNNING, RunStatus.QUEUED)
    for t in data["takeovers"] if running else []:
        # A run taken over after its process went (P-39): each attempt that ended so, in a row, shown
        # while it still runs, so an operator sees it heading for quarantine (an ended one lists them
        # in its error).
        print(escape(f"taken over: attempt of {t.get('owner')} {t.get('ended')}, noticed by {t.get('taken_by')}"))
    for link in data["approval_links"]:
        if link["url"]:
            print(f"approve or decline call {link['seq']} at: {link['url']}")
    if data["status"] == RunStatus.PAUSED and data["approval_links"] and not data["approval_links"][0]["url"]:
        print("(set [server] public_url in tether.toml to get an approval link for it)")
    outcome = data.get("outcome") or {}
    if outcome.get("error"):
        print(escape(f"error: [{outcome['error'].get('code')}] {outcome['error'].get('message')}", keep_lines=True))
        for a in (outcome["error"].get("details") or {}).get("attempts") or []:
            # A quarantined run (P-39): each attempt that ended with its process gone.
            print(escape(f"  attempt of {a.get('owner')}: {a.get('ended')}, noticed by {a.get('taken_by')}"))
        if outcome["error"].get("next_action"):
            print(escape(f"next: {outcome['error']['next_action']}"))
    elif data["status"] == RunStatus.COMPLETED:
        print("result:", escape(json.dumps(outcome.get("result"), ensure_ascii=False)[:2000]))
    return EXIT_OK


async def cmd_runs_await(args: argparse.Namespace) -> int:
    from tether._config import load_config
    from tether._engine.attempt.result import RunResult
    from tether._store import open_store

    store = open_store(load_config(args.config).store.url)
    deadline = time.monotonic() + args.timeout
    delay = 0.05
    try:
        while True:
            run = await store.aio.get_run(args.run_id)
            if run is None:
                raise_not_found(args.run_id)
            if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING) and run.result is not None:
                return print_result(RunResult.from_dict(run.result), args.json)
            if time.monotonic() > deadline:
                if args.json:
                    print_json({"status": run.status, "run_id": run.run_id, "timed_out": True})
                else:
                    print(f"run {run.run_id} is still {run.status} after {args.timeout:g} s", file=sys.stderr)
                return EXIT_TIMED_OUT
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    finally:
        store.close()


def raise_not_found(run_id: str) -> NoReturn:
    raise RunNotFound(f"no run {run_id!r}")


async def cmd_runs_undo(args: argparse.Namespace) -> int:
    """Undo a run's writes (P-46); exit 0 only when every write it applied was undone."""
    tools, config, sources = run_setup(args)
    args.config = config
    principal = args.acting_as
    async with open_rt(args, tools, sources=sources) as rt:
        try:
            result = await rt.resume(args.run_id, "undo", args.reason, principal=principal, actor=actor_for(args),
                                     via="cli")
        except RunNotFound as exc:
            raise owned_elsewhere(rt.store, args.run_id, principal, exc, undone="nothing was undone",
                                  example=f"tether runs undo {args.run_id}") from None
    code = print_result(result, args.json)
    undone = result.status == RunStatus.ROLLED_BACK and all(x.get("undone") for x in result.rollback or [])
    return 0 if undone else code


async def cmd_runs_cancel(args: argparse.Namespace) -> int:
    tools, config, sources = run_setup(args, lenient=True)
    args.config = config
    async with open_rt(args, tools, sources=sources) as rt:
        # Whoever runs the CLI against the store is its operator: ending a
        # run (which sends nothing) is theirs whoever owns it. Deciding a
        # write (`tether resume`) acts as `local` like every other command.
        run = await rt.store.aio.get_run(args.run_id)
        result = await rt.cancel(args.run_id, args.reason or "cancelled from the command line",
                                 principal=run.principal if run is not None else None)
    if result.status != RunStatus.CANCELLED:
        return print_result(result, args.json)
    if args.json:
        print_json(result.to_dict())
    else:
        print(f"{args.run_id}: cancelled")
    return EXIT_OK


async def cmd_runs_signal(args: argparse.Namespace) -> int:
    value = json_arg(args.value)
    tools, config, sources = run_setup(args)
    args.config = config
    async with open_rt(args, tools, sources=sources) as rt:
        try:
            out = await rt.signal(args.run_id, args.name, value, principal=args.acting_as)
        except RunNotFound as exc:
            raise owned_elsewhere(rt.store, args.run_id, args.acting_as, exc, undone="nothing was signalled",
                                  example=f"tether runs signal {args.run_id} {args.name} VALUE") from None
    return print_wait_outcome(out, args.json)


async def cmd_start(args: argparse.Namespace) -> int:
    from tether._app import resolve_tool_spec

    code = read_program(args.program)
    tools = [resolve_tool_spec(t) for t in args.tools]
    async with open_rt(args, tools) as rt:
        run_id = rt.start(code, meta={"tools": tools, "config": abs_path(args.config)},
                          type_check=False if args.no_check else None, key=args.key)
        # With --key the run may have been started before (P-36): say where it is now.
        run = await rt.store.aio.get_run(run_id)
        status = run.status if run is not None else RunStatus.QUEUED
    worker = None if args.no_worker else ensure_worker(args, tools)
    if args.json:
        print_json({"run_id": run_id, "status": status, "worker_pid": worker})
    else:
        print(run_id)
    return EXIT_OK


async def cmd_worker(args: argparse.Namespace) -> int:
    from tether._config import load_config
    from tether._engine.worker import Worker, pid_file, worker_alive
    from tether._hostwork import GraceOnSignal, LoopWatchdog
    from tether._store.private import private_dir

    home = home_of(args)
    private_dir(home)  # beside the store: 0700 when made here (P-44)
    other = worker_alive(home)
    if other is not None and other != os.getpid():
        print(f"a worker is already running for {home} (pid {other})", file=sys.stderr)
        return EXIT_OK
    server = load_config(args.config).server
    loop, stop = asyncio.get_running_loop(), asyncio.Event()

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # As in `tether serve` (D-34): a run holding the loop is named, and a signal stops the worker within
    # the grace period whatever a run is doing (the runs it leaves are taken over). From the start: a
    # signal while its sources load stops it too.
    watchdog = LoopWatchdog(loop, threshold=server.loop_stall_seconds, report=report).start()
    handled = 0
    pid_file(home).write_text(str(os.getpid()))
    try:
        with GraceOnSignal(lambda sig: loop.call_soon_threadsafe(stop.set), grace=server.shutdown_grace_seconds,
                           report=report).installed():
            async with open_rt(args, list(args.tools), report=True) as rt:
                from tether._logs import configure_from

                configure_from(rt.engine.config.log if rt.engine.config is not None else None)
                if rt.engine.sources is not None:
                    rt.engine.sources.refresh_in_background()
                handled = await Worker(rt.engine).work(stop=stop, poll_seconds=args.poll,
                                                       idle_exit_seconds=args.idle_exit)
    finally:
        watchdog.stop()
        if worker_alive(home) == os.getpid():
            pid_file(home).unlink(missing_ok=True)
    print(f"worker {os.getpid()} handled {handled} runs", file=sys.stderr)
    return EXIT_OK


async def cmd_recover(args: argparse.Namespace) -> int:
    async with open_rt(args, list(args.tools)) as rt:
        results = await rt.recover()
    left = [r for r in results if (r.error or {}).get("code") == "tools_unavailable"]
    if args.json:
        print_json([r.to_dict() for r in results])
    else:
        if not results:
            print("no runs to recover")
        for r in results:
            code = (r.error or {}).get("code")
            print(f"{r.run_id}: {r.status}" + (f" [{code}]" if code else ""))
            if r in left:
                print(f"  {(r.error or {}).get('message')}", file=sys.stderr)
    return EXIT_FAILED if left else EXIT_OK


# -- parsers, one per top-level command (build_parser orders them) --------------------


def add_run(sub: Any) -> None:
    sp = sub.add_parser("run", help="run a program")
    sp.add_argument("program", help="path to a .py file, or - for standard input")
    sp.add_argument("--no-check", action="store_true", help="skip the pre-run check (check = \"off\")")
    sp.add_argument("--no-prompt", action="store_true", help="never ask y/n at a pause; exit 3 instead")
    sp.add_argument("--key", metavar="KEY",
                    help="an idempotency key for this request: run again with the same key and the same program, "
                         "and you get the run it started, never a second run (P-36)")
    add_common(sp)
    sp.set_defaults(func=cmd_run)


def add_resume(sub: Any) -> None:
    sp = sub.add_parser("resume", help="decide a paused run's pending write and continue it")
    sp.add_argument("run_id", help="the paused run (tether runs list --status paused)")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--approve", action="store_true", help="send the write(s)")
    g.add_argument("--decline", action="store_true", help="do not send them; the program gets a PermissionError")
    g.add_argument("--cancel", action="store_true", help="end the run; nothing further is sent")
    g.add_argument("--decline-and-undo", action="store_true",
                   help="decline the pause and undo the writes the run applied, newest first (P-46)")
    sp.add_argument("--reason", help="told to the program when declining")
    sp.add_argument("--seq", type=int, action="append",
                    help="a paused write this decision is for (repeatable); see the pause or `runs show`")
    sp.add_argument("--all", action="store_true", help="decide every write the pause waits on")
    add_acting_as(sp)
    add_common(sp)
    sp.set_defaults(func=cmd_resume)


def add_runs(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list and inspect runs").add_subparsers(dest="runs_command", required=True)
    sp = runs.add_parser("list", help="runs, newest first")
    # Choices, so a mistyped status is a usage error naming the real ones rather than an empty list.
    sp.add_argument("--status", choices=[s.value for s in RunStatus], help="only runs in this state")
    sp.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_list)
    sp = runs.add_parser("show", help="one run: its program, call timeline, decisions and outcome")
    sp.add_argument("run_id")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_show)
    from tether.cli.store import add_prune

    add_prune(runs)

    sp = runs.add_parser("await", help="wait until a run ends (or pauses)")
    sp.add_argument("run_id")
    sp.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="give up after this long, exit 4 (default 300)")
    add_common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_await)
    sp = runs.add_parser("cancel", help="cancel a run: nothing further is sent")
    sp.add_argument("run_id")
    sp.add_argument("--reason", help="recorded with the cancellation")
    add_common(sp)
    sp.set_defaults(func=cmd_runs_cancel)
    sp = runs.add_parser("undo", help="undo the writes of an ended (or paused) run, newest first (P-46)")
    sp.add_argument("run_id")
    sp.add_argument("--reason", help="recorded with the rollback")
    add_acting_as(sp)
    add_common(sp)
    sp.set_defaults(func=cmd_runs_undo)
    sp = runs.add_parser("signal", help="send a named signal to a run (await wait_for_signal(name))")
    sp.add_argument("run_id")
    sp.add_argument("name")
    sp.add_argument("value", help="a JSON value")
    add_acting_as(sp)
    add_common(sp)
    sp.set_defaults(func=cmd_runs_signal)


def add_start(sub: Any) -> None:
    sp = sub.add_parser("start", help="queue a program as a background run; prints its run id")
    sp.add_argument("program", help="path to a .py file, or - for standard input")
    sp.add_argument("--no-check", action="store_true", help="skip the pre-run check (check = \"off\")")
    sp.add_argument("--no-worker", action="store_true", help="do not start a worker if none is alive")
    sp.add_argument("--key", metavar="KEY",
                    help="an idempotency key for this request: run again with the same key and the same program, "
                         "and you get the run it started, never a second run (P-36)")
    add_common(sp)
    sp.set_defaults(func=cmd_start)


def add_worker(sub: Any) -> None:
    sp = sub.add_parser("worker", help="run queued runs, timers and orphans for this store")
    sp.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                    help="exit after this long with nothing to do")
    sp.add_argument("--poll", type=float, default=0.2, metavar="SECONDS",
                    help="how often to look for work the store did not announce (default 0.2)")
    add_common(sp)
    sp.set_defaults(func=cmd_worker)


def add_recover(sub: Any) -> None:
    sp = sub.add_parser("recover", help="continue runs whose process died; finish a cancel or expiry left half done")
    add_common(sp)
    sp.set_defaults(func=cmd_recover)

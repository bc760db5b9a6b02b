"""The ``tether`` command line.

Exit codes: 0 completed, 1 failed (or cancelled), 2 bad usage, 3 paused or
waiting (the run continues later), 4 `runs await` timed out.
Every command that prints a result takes ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .errors import TetherError, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED = 0, 1, 2, 3


def _exit_code(status: str) -> int:
    # A run parked on a wait or a timer is not a failure: like a pause, it continues later.
    return {"completed": EXIT_OK, "paused": EXIT_PAUSED, "waiting": EXIT_PAUSED}.get(status, EXIT_FAILED)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def _print_result(result: Any, as_json: bool) -> int:
    data = result.to_dict()
    if as_json:
        _print_json(data)
        return _exit_code(result.status)
    for line in data.get("logs") or []:
        print(line)
    status = data["status"]
    if status == "completed":
        value = data["result"]
        print(value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False))
    elif status == "paused":
        _print_pause(data["run_id"], data["pending"])
    elif status == "waiting":
        p = data["pending"]
        print(f"waiting: run {data['run_id']} is parked ({p['kind']} {p['name']}); it holds no worker")
        print(f"  {data.get('instructions')}")
        if p["kind"] == "wait":
            print(f"  key: {p['key']}")
    else:
        err = data.get("error") or {}
        print(f"{status}: [{err.get('code')}] {err.get('message')}", file=sys.stderr)
        if err.get("details", {}).get("diagnostics"):
            print(err["details"]["diagnostics"], file=sys.stderr)
        if err.get("next_action"):
            print(f"next: {err['next_action']}", file=sys.stderr)
    for note in data.get("notes") or []:
        print(f"note: {note}", file=sys.stderr)
    return _exit_code(status)


def _call_text(w: dict) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in (w.get("args") or {}).items())
    return f"call {w['seq']}: {w['address']}({args})"


def _print_pause(run_id: str, pending: dict) -> None:
    """The writes a pause waits on, each with the commands that decide it by its seq (P-28)."""
    writes = pending.get("writes") or [pending]
    undecided = [w for w in writes if not w.get("decision")]
    if len(writes) == 1:
        print(f"paused: run {run_id} waits for approval of {_call_text(writes[0])}")
    else:
        print(f"paused: run {run_id} waits for approval of {len(writes)} writes issued together:")
        for w in writes:
            taken = w.get("decision")
            print(f"  {_call_text(w)}" + (f"  [{taken['decision']}d]" if taken else ""))
    seqs = " ".join(f"--seq {w['seq']}" for w in undecided)
    print(f"  approve: tether resume {run_id} --approve {seqs}")
    print(f"  decline: tether resume {run_id} --decline {seqs} --reason '...'")
    if len(undecided) > 1:
        print("  (name some seqs to decide those; the run continues once every write is decided)")
    print(f"  cancel:  tether resume {run_id} --cancel")


def _read_program(path: str) -> str:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read program {path}: {exc.strerror}", code="file_not_found",
                         next_action="Pass the path of a Python file, or - for standard input.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = "standard input" if path == "-" else path
        line = data[:exc.start].count(b"\n") + 1
        raise UsageError(f"the program in {where} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
                         "nothing was run", code="program_not_utf8",
                         next_action="Save the program as UTF-8 (Python's own default) and run it again.") from None


def _runtime(args: argparse.Namespace, tools: Sequence[str] = (), *, sources: list[dict] | None = None,
             report: bool = False) -> Any:
    from .app import open_runtime

    type_check = False if getattr(args, "no_check", False) else None
    return open_runtime(config_path=args.config, tools=tools, type_check=type_check, sources=sources,
                        report=_report if report else None)


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _ask_inline(pending: dict) -> tuple[str, str | None]:
    args = ", ".join(f"{k}={v!r}" for k, v in pending["args"].items())
    prompt = f"Allow write {pending['address']}({args})? [y/N] "
    answer = await asyncio.to_thread(input, prompt)
    return ("approve", None) if answer.strip().lower() in ("y", "yes") else ("decline", "declined at the terminal")


async def _ask_question(question: dict) -> dict:
    """An upstream tool's form, asked field by field at the terminal."""
    schema = question.get("schema") or {}
    if question.get("mode") != "form":
        return {"action": "decline"}
    print(f"{question['address']} asks: {question['message']}")
    content: dict = {}
    for name, prop in (schema.get("properties") or {}).items():
        raw = await asyncio.to_thread(input, f"  {prop.get('title') or name}: ")
        kind = prop.get("type")
        try:
            content[name] = (int(raw) if kind == "integer" else float(raw) if kind == "number"
                             else raw.strip().lower() in ("y", "yes", "true", "1") if kind == "boolean" else raw)
        except ValueError:
            return {"action": "decline"}
    sure = await asyncio.to_thread(input, "Send these answers? [y/N] ")
    return {"action": "accept", "content": content} if sure.strip().lower() in ("y", "yes") else {"action": "decline"}


# -- commands ---------------------------------------------------------------------


async def cmd_run(args: argparse.Namespace) -> int:
    from .app import resolve_tool_spec

    code = _read_program(args.program)
    tools = [resolve_tool_spec(t) for t in args.tools]
    async with _runtime(args, tools, report=True) as rt:
        interactive = sys.stdin.isatty() and sys.stdout.isatty() and not args.no_prompt and not args.json
        approver = None
        if interactive:
            async def approver(pending: dict) -> tuple[str, str | None]:
                return await _ask_inline(pending)
            # Recorded with each decision taken at the prompt (P-29).
            approver.actor, approver.via = _local_user(), "cli"  # type: ignore[attr-defined]
        result = await rt.execute(code, on_approval=approver,
                                  on_question=_ask_question if interactive else None,
                                  meta={"tools": tools, "config": _abs(args.config)})
    if result.status == "waiting" and result.expires_at is not None:
        # A timer or a timeout must fire with nobody watching: make sure a worker will.
        _ensure_worker(args, tools)
    return _print_result(result, args.json)


def _abs(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


async def cmd_resume(args: argparse.Namespace) -> int:
    decision = "approve" if args.approve else "decline" if args.decline else "cancel"
    tools, config, sources = _recorded_setup(args)
    args.config = config
    actor = _local_user()
    async with _runtime(args, tools, sources=sources) as rt:
        seqs = list(args.seq or [])
        if args.all:
            seqs += [w.seq for w in rt.pending(args.run_id) if w.decision is None]
        elif not seqs and decision != "cancel" and sys.stdin.isatty() and sys.stdout.isatty() and not args.json:
            # No seq: the person at the terminal is shown each write and says which (P-28).
            waiting = rt.pending(args.run_id)
            seqs = await _confirm_each(waiting, decision)
            if waiting and not seqs:
                print("nothing decided")
                return EXIT_PAUSED
        if seqs:
            result = await rt.decide(args.run_id, {s: (decision, args.reason) for s in seqs}, actor=actor, via="cli")
        else:
            result = await rt.resume(args.run_id, decision, args.reason, actor=actor, via="cli")
        return _print_result(result, args.json)


async def _confirm_each(pending: list, decision: str) -> list[int]:
    chosen = []
    for w in pending:
        if w.decision is None:
            answer = await asyncio.to_thread(input, f"{decision} {_call_text(w.to_dict())}? [y/N] ")
            if answer.strip().lower() in ("y", "yes"):
                chosen.append(w.seq)
    return chosen


def _local_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment: the run's owner stands for it
        return "local"


def _recorded_setup(args: argparse.Namespace, *,
                    lenient: bool = False) -> tuple[list[str], str | None, list[dict] | None]:
    """The tools and sources a run was started with, so resume needs no flags (P-30), once signed (P-35).

    A run records its sources' definitions; one started before it did records
    only the config file it named, which is used if it is still there.
    """
    from .config import load_config
    from .store import open_store
    from .waits_cli import trusted_meta

    config = load_config(args.config)
    store = open_store(config.store.url)
    try:
        recorded = trusted_meta(store, store.get_run(args.run_id), lenient=lenient)
    finally:
        store.close()
    return recorded_setup(args, recorded)


def recorded_setup(args: argparse.Namespace, recorded: dict) -> tuple[list[str], str | None, list[dict] | None]:
    """``recorded``: a run's meta that verified (``waits_cli.trusted_meta``), or {}."""
    tools = list(args.tools or recorded.get("tools") or [])
    sources = recorded.get("sources")
    path = recorded.get("config")
    if args.config is None and sources is None and path and Path(path).is_file():
        return tools, path, None
    return tools, args.config, sources


async def cmd_runs_list(args: argparse.Namespace) -> int:
    from .config import load_config
    from .store import open_store

    store = open_store(load_config(args.config).store.url)
    try:
        runs = store.list_runs(status=args.status, limit=args.limit)
    finally:
        store.close()
    rows = [{"run_id": r.run_id, "status": r.status, "created_at": r.created_at, "updated_at": r.updated_at,
             "pending": (r.pending or {}).get("address"), "error": (r.error or {}).get("code")} for r in runs]
    if args.json:
        _print_json(rows)
        return EXIT_OK
    if not rows:
        print("no runs")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        extra = f" waits on {r['pending']}" if r["pending"] else (f" [{r['error']}]" if r["error"] else "")
        print(f"{r['run_id']}  {r['status']:<9}  {when}{extra}")
    return EXIT_OK


async def cmd_runs_show(args: argparse.Namespace) -> int:
    from .config import load_config
    from .runs.inspect import run_timeline
    from .server.approvals import run_links
    from .store import open_store

    config = load_config(args.config)
    store = open_store(config.store.url)
    try:
        data = run_timeline(store, args.run_id)
        run = store.get_run(args.run_id)
        # Approval links need [server] public_url: where people reach the server.
        if run is not None and run.status == "paused":
            from .runs.runtime import Runtime

            # A runtime over the store only (no tools, no workers started): it reads the pause.
            data["approval_links"] = run_links(Runtime(store=store), config.server.public_url, run)
        else:
            data["approval_links"] = []
    finally:
        store.close()
    if args.json:
        _print_json(data)
        return EXIT_OK
    print(f"run {data['run_id']}: {data['status']}")
    print("program:")
    for i, line in enumerate(data["program"].splitlines(), 1):
        print(f"  {i:>3} | {line}")
    print("calls:")
    for c in data["calls"]:
        ms = f"{c['ms']:.1f} ms" if c.get("ms") is not None else "-"
        print(f"  #{c['seq']:<3} {c['kind']:<5} {c['address']:<32} {c['state']:<9} {ms}")
    for d in data.get("decisions") or []:
        why = f" ({d['reason']})" if d.get("reason") else ""
        print(f"decided: call {d['seq']} {d['decision']}{why} by {d.get('actor')} via {d.get('via')}")
    if data.get("pending") and data["status"] == "paused":
        _print_pause(data["run_id"], data["pending"])
    elif data.get("pending"):
        print(f"pending: call {data['pending']['seq']} {data['pending'].get('address') or data['pending'].get('name')}")
    for link in data["approval_links"]:
        if link["url"]:
            print(f"approve or decline call {link['seq']} at: {link['url']}")
    if data["status"] == "paused" and data["approval_links"] and not data["approval_links"][0]["url"]:
        print("(set [server] public_url in tether.toml to get an approval link for it)")
    outcome = data.get("outcome") or {}
    if outcome.get("error"):
        print(f"error: [{outcome['error'].get('code')}] {outcome['error'].get('message')}")
    elif data["status"] == "completed":
        print("result:", json.dumps(outcome.get("result"), ensure_ascii=False)[:2000])
    return EXIT_OK


async def cmd_recover(args: argparse.Namespace) -> int:
    async with _runtime(args, list(args.tools)) as rt:
        results = await rt.recover()
    left = [r for r in results if (r.error or {}).get("code") == "tools_unavailable"]
    if args.json:
        _print_json([r.to_dict() for r in results])
    else:
        if not results:
            print("no runs to recover")
        for r in results:
            code = (r.error or {}).get("code")
            print(f"{r.run_id}: {r.status}" + (f" [{code}]" if code else ""))
            if r in left:
                print(f"  {r.error['message']}", file=sys.stderr)
    return EXIT_FAILED if left else EXIT_OK


async def cmd_tools_search(args: argparse.Namespace) -> int:
    async with _runtime(args, list(args.tools)) as rt:
        found = rt.search(args.query, namespace=args.namespace, limit=args.limit, offset=args.offset)
    if args.json:
        _print_json(found)
        return EXIT_OK
    for item in found["results"]:
        ro = "read " if item["annotations"]["read_only"] else "write"
        print(f"{item['address']:<36} {ro}  {(item.get('description') or '').splitlines()[0][:70] if item.get('description') else ''}")
    if found.get("next_offset") is not None:
        print(f"... more: --offset {found['next_offset']}")
    return EXIT_OK


async def cmd_tools_describe(args: argparse.Namespace) -> int:
    async with _runtime(args, list(args.tools)) as rt:
        described = rt.describe(list(args.address), detail="full" if args.full else "default")
    if args.json:
        _print_json(described)
        return EXIT_OK
    status = EXIT_OK
    for d in described:
        if d.get("error"):
            status = EXIT_FAILED
            print(f"{d['address']}: unknown tool; did you mean: {', '.join(d.get('suggestions') or []) or '-'}")
            continue
        print(d["signature"])
        if d.get("parameters"):
            print(f"    # parameters {d['parameters']}")
        if d.get("description"):
            print(f'    """{d["description"]}"""')
        if d.get("types"):
            print()
            print(d["types"])
        if d.get("note"):
            print(f"# {d['note']}")
        print()
    return status


async def cmd_sources_list(args: argparse.Namespace) -> int:
    async with _runtime(args, list(args.tools)) as rt:
        if getattr(args, "refresh", False):
            await rt.source_set.refresh()
        statuses = [s.status() for s in rt.source_set.statuses()]
        namespaces = rt.sources()
    all_ok = all(s["ok"] for s in statuses)
    if args.json:
        _print_json({"sources": statuses, "namespaces": namespaces})
        return EXIT_OK if all_ok else EXIT_FAILED
    for s in statuses:
        state = f"{s['tools']} tools" if s["ok"] else f"FAILED: {s['error']}"
        print(f"{s['source']:<24} {s['type']:<8} {state}")
        if s.get("origin"):
            print(f"    from {s['origin']}")
        for p in s["problems"]:
            print(f"    skipped {p.get('operation')}: {p.get('problem')}")
    if not statuses:
        print("no sources configured (add [[sources]] to tether.toml or pass --tools)")
    # The same lines a program gets from sources() and the prompt names.
    if namespaces:
        print("namespaces:")
    for ns in namespaces:
        what = ns.get("summary") or (f"unavailable: {ns['error']}" if ns.get("error") else "")
        print(f"  {ns['namespace']} ({ns['tools']} tools): {what}")
    return EXIT_OK if all(s["ok"] for s in statuses) else EXIT_FAILED


async def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DEMO_PROGRAM

    print("tether demo: a help desk with customers, tickets and comments.\n")
    print("The program an agent would send:\n")
    for line in DEMO_PROGRAM.strip().splitlines():
        print(f"    {line}")
    print()
    async with _runtime(args, ["tether.demo.helpdesk"]) as rt:
        result = await rt.execute(DEMO_PROGRAM, meta={"tools": ["tether.demo.helpdesk"]})
    if args.json:
        _print_json(result.to_dict())
        return _exit_code(result.status)
    if result.status == "completed" and isinstance(result.result, dict) and "by_priority" in result.result:
        _print_demo_summary(result.result)
        code = EXIT_OK
    else:
        code = _print_result(result, False)
    d = result.diagnostics
    print(f"\n{result.calls} host calls in {d.get('total_ms', 0):.1f} ms (run {result.run_id}; "
          f"see: tether runs show {result.run_id})")
    return code


# -- long work: background runs, waits, signals --------------------------------------


def _home(args: argparse.Namespace) -> Path:
    from .config import load_config

    return load_config(args.config).home


def _ensure_worker(args: argparse.Namespace, tools: Sequence[str]) -> int | None:
    """Start a detached worker for this home unless one is alive: users need not know a runner exists."""
    import subprocess

    from .runs.worker import worker_alive

    home = _home(args)
    pid = worker_alive(home)
    if pid is not None:
        return pid
    home.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tether.cli"]
    if args.config:
        cmd += ["--config", str(Path(args.config).resolve())]
    cmd += ["worker", "--idle-exit", "60"]
    for t in tools:
        cmd += ["--tools", t]
    env = dict(os.environ, TETHER_HOME=str(home))
    with open(home / "worker.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True, cwd=os.getcwd())
    return proc.pid


async def cmd_start(args: argparse.Namespace) -> int:
    from .app import resolve_tool_spec

    code = _read_program(args.program)
    tools = [resolve_tool_spec(t) for t in args.tools]
    async with _runtime(args, tools) as rt:
        run_id = rt.start(code, meta={"tools": tools, "config": _abs(args.config)},
                          type_check=False if args.no_check else None)
    worker = None if args.no_worker else _ensure_worker(args, tools)
    if args.json:
        _print_json({"run_id": run_id, "status": "queued", "worker_pid": worker})
    else:
        print(run_id)
    return EXIT_OK


async def cmd_worker(args: argparse.Namespace) -> int:
    from .runs.worker import pid_file, work, worker_alive

    home = _home(args)
    home.mkdir(parents=True, exist_ok=True)
    other = worker_alive(home)
    if other is not None and other != os.getpid():
        print(f"a worker is already running for {home} (pid {other})", file=sys.stderr)
        return EXIT_OK
    pid_file(home).write_text(str(os.getpid()))
    try:
        async with _runtime(args, list(args.tools), report=True) as rt:
            rt.source_set.refresh_in_background()
            handled = await work(rt, poll_seconds=args.poll, idle_exit_seconds=args.idle_exit)
    finally:
        if worker_alive(home) == os.getpid():
            pid_file(home).unlink(missing_ok=True)
    print(f"worker {os.getpid()} handled {handled} runs", file=sys.stderr)
    return EXIT_OK


async def cmd_runs_await(args: argparse.Namespace) -> int:
    from .config import load_config
    from .runs.result import RunResult
    from .store import open_store

    store = open_store(load_config(args.config).store.url)
    deadline = time.monotonic() + args.timeout
    delay = 0.05
    try:
        while True:
            run = store.get_run(args.run_id)
            if run is None:
                raise_not_found(args.run_id)
            if run.status not in ("queued", "running", "waiting") and run.result is not None:
                return _print_result(RunResult.from_dict(run.result), args.json)
            if time.monotonic() > deadline:
                if args.json:
                    _print_json({"status": run.status, "run_id": run.run_id, "timed_out": True})
                else:
                    print(f"run {run.run_id} is still {run.status} after {args.timeout:g} s", file=sys.stderr)
                return 4
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    finally:
        store.close()


def raise_not_found(run_id: str) -> None:
    from .errors import RunNotFound

    raise RunNotFound(f"no run {run_id!r}")


async def cmd_runs_cancel(args: argparse.Namespace) -> int:
    tools, config, sources = _recorded_setup(args, lenient=True)
    args.config = config
    async with _runtime(args, tools, sources=sources) as rt:
        # Whoever runs the CLI against the store is its operator: ending a
        # run (which sends nothing) is theirs whoever owns it. Deciding a
        # write (`tether resume`) acts as `local` like every other command.
        run = rt.store.get_run(args.run_id)
        result = await rt.cancel(args.run_id, args.reason or "cancelled from the command line",
                                 principal=run.principal if run is not None else None)
    if result.status != "cancelled":
        return _print_result(result, args.json)
    if args.json:
        _print_json(result.to_dict())
    else:
        print(f"{args.run_id}: cancelled")
    return EXIT_OK


async def cmd_runs_signal(args: argparse.Namespace) -> int:
    value = _json_arg(args.value)
    tools, config, sources = _recorded_setup(args)
    args.config = config
    async with _runtime(args, tools, sources=sources) as rt:
        out = await rt.signal(args.run_id, args.name, value)
    return _print_wait_outcome(out, args.json)


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"not valid JSON: {exc.msg} at column {exc.colno}", code="invalid_arguments",
                         next_action='Quote JSON for the shell, e.g. \'{"ok": true}\' or \'"text"\'.') from None


def _print_wait_outcome(out: dict, as_json: bool) -> int:
    if as_json:
        _print_json(out)
    else:
        print(out["status"])
        run = out.get("run")
        if run:
            print(f"run {run['run_id']}: {run['status']}")
        if out.get("next_action"):
            print(f"next: {out['next_action']}", file=sys.stderr)
    return EXIT_OK if out["status"] in ("accepted", "already_resolved") else EXIT_FAILED


async def cmd_waits_list(args: argparse.Namespace) -> int:
    from .config import load_config
    from .runs.runtime import Runtime
    from .store import open_store

    store = open_store(load_config(args.config).store.url)
    try:
        rt = Runtime(store=store, type_check=False)
        waits = rt.list_waits(args.run)
    finally:
        store.close()
    if args.json:
        _print_json(waits)
        return EXIT_OK
    if not waits:
        print("no pending waits")
    for w in waits:
        due = "" if w["deadline"] is None else f" (times out {time.strftime('%H:%M:%S', time.localtime(w['deadline']))})"
        print(f"{w['run_id']}  {w['name']:<20} {w['key']}{due}")
    return EXIT_OK


async def cmd_waits_resolve(args: argparse.Namespace) -> int:
    from .waits_cli import recorded_setup_for_key

    value = None if args.error is not None else _json_arg(args.value)
    tools, config, sources = recorded_setup_for_key(args)
    args.config = config
    async with _runtime(args, tools, sources=sources) as rt:
        out = await rt.resolve_wait(args.key, value, error=args.error)
    return _print_wait_outcome(out, args.json)


def _print_demo_summary(r: dict) -> None:
    print("The program's result, for people:\n")
    print(f"  tools it found:     {', '.join(r.get('tools_found') or [])}")
    prio = ", ".join(f"{k} {v}" for k, v in sorted(r["by_priority"].items(), key=lambda kv: -kv[1]))
    print(f"  open tickets:       {r.get('open_tickets')} ({prio})")
    busiest = ", ".join(f"{b['customer']} ({b['open']})" for b in r.get("busiest_customers") or [])
    print(f"  busiest customers:  {busiest}")
    print("  oldest open tickets:")
    for t in r.get("oldest_open") or []:
        who = t.get("assignee") or "unassigned"
        print(f"    {t['id']}  {t['opened']}  {t['priority']:<7} {t['title'][:40]:<40}  {t['customer']} · {who}")


async def cmd_waits_revoke(args: argparse.Namespace) -> int:
    if not (args.run or args.session):
        raise UsageError("say whose waits to revoke: --run RUN_ID or --session NAME", code="invalid_arguments")
    async with _runtime(args, []) as rt:
        n = rt.revoke_waits(run_id=args.run, session=args.session)
    if args.json:
        _print_json({"revoked": n})
    else:
        print(f"revoked {n} waits")
    return EXIT_OK


async def cmd_sessions_reset(args: argparse.Namespace) -> int:
    async with _runtime(args, []) as rt:
        existed = rt.reset_session(args.name)
    if args.json:
        _print_json({"session": args.name, "reset": existed})
    else:
        print(f"session {args.name}: " + ("reset" if existed else "no stored state (its waits, if any, are revoked)"))
    return EXIT_OK


async def cmd_prompt(args: argparse.Namespace) -> int:
    async with _runtime(args, list(args.tools)) as rt:
        print(rt.model_description())
    return EXIT_OK


async def cmd_serve(args: argparse.Namespace) -> int:
    from .server.mcp import serve

    return await serve(args)


# -- parser -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether", description="Run model-written Python against tools, durably.")
    p.add_argument("--config", help="path to tether.toml (default: ./tether.toml if present)")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser, tools: bool = True) -> None:
        sp.add_argument("--json", action="store_true", help="print JSON for scripts")
        if tools:
            sp.add_argument("--tools", action="append", default=[],
                            help="a .py file or dotted module with @tool functions (repeatable)")

    sp = sub.add_parser("run", help="run a program")
    sp.add_argument("program", help="path to a .py file, or - for standard input")
    sp.add_argument("--no-check", action="store_true", help="skip the pre-run check (check = \"off\")")
    sp.add_argument("--no-prompt", action="store_true", help="never ask y/n at a pause; exit 3 instead")
    common(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("resume", help="decide a paused run's pending write and continue it")
    sp.add_argument("run_id")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--approve", action="store_true")
    g.add_argument("--decline", action="store_true")
    g.add_argument("--cancel", action="store_true")
    sp.add_argument("--reason", help="told to the program when declining")
    sp.add_argument("--seq", type=int, action="append",
                    help="a paused write this decision is for (repeatable); see the pause or `runs show`")
    sp.add_argument("--all", action="store_true", help="decide every write the pause waits on")
    common(sp)
    sp.set_defaults(func=cmd_resume)

    runs = sub.add_parser("runs", help="list and inspect runs").add_subparsers(dest="runs_command", required=True)
    sp = runs.add_parser("list")
    sp.add_argument("--status")
    sp.add_argument("--limit", type=int, default=50)
    common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_list)
    sp = runs.add_parser("show")
    sp.add_argument("run_id")
    common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_show)

    sp = runs.add_parser("await", help="wait until a run ends (or pauses)")
    sp.add_argument("run_id")
    sp.add_argument("--timeout", type=float, default=300.0)
    common(sp, tools=False)
    sp.set_defaults(func=cmd_runs_await)
    sp = runs.add_parser("cancel", help="cancel a run: nothing further is sent")
    sp.add_argument("run_id")
    sp.add_argument("--reason")
    common(sp)
    sp.set_defaults(func=cmd_runs_cancel)
    sp = runs.add_parser("signal", help="send a named signal to a run (await wait_for_signal(name))")
    sp.add_argument("run_id")
    sp.add_argument("name")
    sp.add_argument("value", help="a JSON value")
    common(sp)
    sp.set_defaults(func=cmd_runs_signal)

    sp = sub.add_parser("start", help="queue a program as a background run; prints its run id")
    sp.add_argument("program", help="path to a .py file, or - for standard input")
    sp.add_argument("--no-check", action="store_true", help="skip the pre-run check (check = \"off\")")
    sp.add_argument("--no-worker", action="store_true", help="do not start a worker if none is alive")
    common(sp)
    sp.set_defaults(func=cmd_start)

    sp = sub.add_parser("worker", help="run queued runs, timers and orphans for this store")
    sp.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                    help="exit after this long with nothing to do")
    sp.add_argument("--poll", type=float, default=0.2, metavar="SECONDS")
    common(sp)
    sp.set_defaults(func=cmd_worker)

    waits = sub.add_parser("waits", help="durable waits").add_subparsers(dest="waits_command", required=True)
    sp = waits.add_parser("list", help="pending waits with their keys")
    sp.add_argument("--run")
    common(sp, tools=False)
    sp.set_defaults(func=cmd_waits_list)
    sp = waits.add_parser("resolve", help="resolve a wait by its key; the first resolution wins")
    sp.add_argument("key")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--value", help="a JSON value")
    g.add_argument("--error", help="fail the wait with this message")
    common(sp)
    sp.set_defaults(func=cmd_waits_resolve)

    from . import cells_cli

    cells_cli.add_parser(sub, common, sys.modules[__name__])

    sp = waits.add_parser("revoke", help="revoke every pending wait of a run or a session")
    sp.add_argument("--run")
    sp.add_argument("--session")
    common(sp, tools=False)
    sp.set_defaults(func=cmd_waits_revoke)

    sessions = sub.add_parser("sessions", help="REPL sessions").add_subparsers(dest="sessions_command", required=True)
    sp = sessions.add_parser("reset", help="forget a session's globals and revoke its waits")
    sp.add_argument("name")
    common(sp, tools=False)
    sp.set_defaults(func=cmd_sessions_reset)

    sp = sub.add_parser("recover", help="continue runs whose process died")
    common(sp)
    sp.set_defaults(func=cmd_recover)

    tools = sub.add_parser("tools", help="search and describe tools").add_subparsers(dest="tools_command", required=True)
    sp = tools.add_parser("search")
    sp.add_argument("query", nargs="?", default="")
    sp.add_argument("--namespace")
    sp.add_argument("--limit", type=int, default=12)
    sp.add_argument("--offset", type=int, default=0)
    common(sp)
    sp.set_defaults(func=cmd_tools_search)
    sp = tools.add_parser("describe")
    sp.add_argument("address", nargs="+")
    sp.add_argument("--full", action="store_true", help="every shape and the whole description (default: at most 2 KB a tool)")
    common(sp)
    sp.set_defaults(func=cmd_tools_describe)

    sources = sub.add_parser("sources", help="configured tool sources").add_subparsers(dest="sources_command", required=True)
    sp = sources.add_parser("list", help="each source: tools, skipped operations, errors")
    common(sp)
    sp.set_defaults(func=cmd_sources_list, refresh=False)
    sp = sources.add_parser("refresh", help="start every MCP server and update its cached tool listing")
    common(sp)
    sp.set_defaults(func=cmd_sources_list, refresh=True)

    sp = sub.add_parser("demo", help="run the built-in help desk demo")
    common(sp, tools=False)
    sp.add_argument("--no-check", action="store_true", help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("prompt", help="print the model-facing description of the sandbox API")
    common(sp)
    sp.set_defaults(func=cmd_prompt)

    sp = sub.add_parser("serve", help="serve tether over MCP")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--stdio", action="store_true", help="MCP over standard input/output")
    g.add_argument("--http", metavar="HOST:PORT", help="MCP over streamable HTTP")
    sp.add_argument("--dev", action="store_true", help="allow HTTP without a token on a loopback address")
    common(sp)
    sp.set_defaults(func=cmd_serve)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = asyncio.run(args.func(args))
    except TetherError as exc:
        if getattr(args, "json", False):
            _print_json({"status": "error", "error": exc.to_dict()})
        else:
            print(f"error: {exc}", file=sys.stderr)
            print(f"next: {exc.next_action}", file=sys.stderr)
        code = EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        # The reader went away (`tether runs list | head`): what it wanted was
        # printed. Point stdout at devnull so the final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    # A normal exit: the sandbox pool waits for Monty's last deliveries when it
    # closes (tether.sandbox.monty, D-23), so interpreter shutdown is safe.
    sys.exit(code)


if __name__ == "__main__":
    main()

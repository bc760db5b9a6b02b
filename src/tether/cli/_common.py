"""What the commands share: printing results, opening a runtime, a run's recorded setup."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from tether._store.states import RunStatus
from tether._tools.shown import escape, show_call
from tether.errors import InvalidArguments, ProgramFileNotFound, ProgramNotUtf8, RunNotFound

if TYPE_CHECKING:  # the command line imports the engine lazily, to start fast
    from contextlib import AbstractAsyncContextManager

    from tether._runtime import Runtime
    from tether._store.base import RunRecord, Store

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED = 0, 1, 2, 3
EXIT_TIMED_OUT = 4


def add_common(sp: argparse.ArgumentParser, tools: bool = True) -> None:
    """--json on every command; --tools on those that load tools."""
    sp.add_argument("--json", action="store_true", help="print JSON for scripts")
    if tools:
        sp.add_argument("--tools", action="append", default=[],
                        help="a .py file or dotted module with @tool functions (repeatable)")


def add_acting_as(sp: argparse.ArgumentParser) -> None:
    """``--as PRINCIPAL``: the operator acts on a run another principal owns (docs/security.md, P-24).

    The command line opens the store itself, so whoever runs it is the store's
    operator; HTTP callers have no such flag and are held to their token's principal.
    """
    sp.add_argument("--as", dest="acting_as", metavar="PRINCIPAL", type=_principal,
                    help="act on a run owned by PRINCIPAL (e.g. token:… as `tether runs show` prints it); "
                         "default: local")


def _principal(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a principal, e.g. local or token:…")
    return text.strip()


def actor_for(args: argparse.Namespace) -> str:
    """Who decided, for the run's record: the operator's user name, and whom they acted as."""
    acting_as = getattr(args, "acting_as", None)
    return local_user() + (f" (as {acting_as})" if acting_as else "")


def exit_code(status: str) -> int:
    # A run parked on a wait or a timer is not a failure: like a pause, it continues later.
    codes: dict[str, int] = {RunStatus.COMPLETED: EXIT_OK, RunStatus.PAUSED: EXIT_PAUSED,
                             RunStatus.WAITING: EXIT_PAUSED}
    return codes.get(status, EXIT_FAILED)


def show(text: str = "") -> None:
    """Print text that may hold what an upstream wrote (a tool's name, description, a source's summary) with
    its control and format characters escaped: a description cannot clear, retitle or reorder the operator's
    terminal. Newlines and tabs stay."""
    print(escape(text, keep_lines=True))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def print_result(result: Any, as_json: bool) -> int:
    data = result.to_dict()
    if as_json:
        print_json(data)
        return exit_code(result.status)
    # What a program printed or returned goes to a terminal: control characters are shown
    # escaped (an ANSI "conceal" or an OSC 52 clipboard write is text here, not an effect).
    # --json stays exact.
    for line in data.get("logs") or []:
        print(escape(str(line), keep_lines=True))
    status = data["status"]
    if status == RunStatus.COMPLETED:
        value = data["result"]
        print(escape(value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False),
                     keep_lines=True))
    elif status == RunStatus.PAUSED:
        print_pause(data["run_id"], data["pending"], expires_at=data.get("expires_at"))
    elif status == RunStatus.WAITING:
        p = data["pending"]
        print(f"waiting: run {data['run_id']} is parked ({p['kind']} {escape(p['name'])}); it holds no worker")
        print(f"  {escape(str(data.get('instructions')))}")
        if p["kind"] == "wait":
            print(f"  key: {p['key']}")
    else:
        err = data.get("error") or {}
        print(escape(f"{status}: [{err.get('code')}] {err.get('message')}", keep_lines=True), file=sys.stderr)
        if err.get("details", {}).get("diagnostics"):
            print(escape(str(err["details"]["diagnostics"]), keep_lines=True), file=sys.stderr)
        if err.get("next_action"):
            print(escape(f"next: {err['next_action']}", keep_lines=True), file=sys.stderr)
    for line in data.get("rollback") or []:
        print(escape(rollback_line(line), keep_lines=True))
    for note in data.get("notes") or []:
        print(escape(f"note: {note}", keep_lines=True), file=sys.stderr)
    return exit_code(status)


def rollback_line(line: dict[str, Any]) -> str:
    """One write of a rollback as the terminal shows it (P-46): undone by which call, or why not."""
    undo = line.get("undo") or {}
    head = f"call {line.get('seq')} {line.get('address')}"
    if line.get("undone"):
        return f"  undone: {head} by call {undo.get('seq')} {undo.get('address')}"
    return f"  not undone: {head}: {line.get('why')}"


def call_text(w: dict, budget: int = 600) -> str:
    """A write as the terminal shows it: every argument named (secrets hidden), values shortened evenly, escaped."""
    from tether._engine.attempt.redaction import shown_args

    return f"call {w['seq']}: " + show_call(str(w["address"]), shown_args(w), budget=budget).line()


def when(moment: float | None) -> str:
    """A Unix time as people read it: ISO-8601 in UTC, to the second."""
    if moment is None:
        return "-"
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _print_why(write: dict, indent: str) -> None:
    """Why lineage made a write wait (writes = "guard", P-45), one line per destination that asked."""
    from tether._engine.lineage.why import why_lines

    for line in why_lines(write.get("reasons") or (), write.get("args") or {}):
        print(f"{indent}why: {line}")


def print_pause(run_id: str, pending: dict, owner: str | None = None, expires_at: float | None = None) -> None:
    """The writes a pause waits on, each with the commands that decide it by its seq (P-28).

    For a run another principal owns (started over HTTP with a token), the
    commands carry the ``--as`` that acts for it: without it they answer run_not_found.
    """
    acting = f" --as {owner}" if owner and owner != "local" else ""
    writes = pending.get("writes") or [pending]
    undecided = [w for w in writes if not w.get("decision")]
    if len(writes) == 1:
        print(f"paused: run {run_id} waits for approval of {call_text(writes[0])}")
        _print_why(writes[0], "  ")
    else:
        print(f"paused: run {run_id} waits for approval of {len(writes)} writes issued together:")
        for w in writes:
            taken = w.get("decision")
            print(f"  {call_text(w)}" + (f"  [{taken['decision']}d]" if taken else ""))
            _print_why(w, "    ")
    seqs = " ".join(f"--seq {w['seq']}" for w in undecided)
    print(f"  approve: tether resume {run_id} --approve {seqs}{acting}")
    print(f"  decline: tether resume {run_id} --decline {seqs} --reason '...'{acting}")
    if len(undecided) > 1:
        print("  (name some seqs to decide those; the run continues once every write is decided)")
    print(f"  cancel:  tether resume {run_id} --cancel{acting}")
    if acting:
        print(f"  (the run is owned by {owner}: --as acts for it)")
    if expires_at is not None:
        print(f"  the pause expires at {when(expires_at)}")


def read_program(path: str) -> str:
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise ProgramFileNotFound(f"cannot read program {path}: {exc.strerror}",
                                  next_action="Pass the path of a Python file, or - for standard input.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = "standard input" if path == "-" else path
        line = data[:exc.start].count(b"\n") + 1
        raise ProgramNotUtf8(f"the program in {where} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
                             "nothing was run",
                             next_action="Save the program as UTF-8 (Python's own default) and run it again.") from None


def open_rt(args: argparse.Namespace, tools: Sequence[str] = (), *, sources: list[dict] | None = None,
            report: bool = False) -> AbstractAsyncContextManager[Runtime]:
    # Typed, so the checker sees a command that hands the Runtime where its engine is wanted (`cells start` did).
    from tether._app import open_runtime

    type_check = False if getattr(args, "no_check", False) else None
    return open_runtime(config_path=args.config, tools=tools, type_check=type_check, sources=sources,
                        report=_report if report else None)


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def abs_path(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def local_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment: the run's owner stands for it
        return "local"


def run_setup(args: argparse.Namespace, *,
              lenient: bool = False) -> tuple[list[str], str | None, list[dict] | None]:
    """The tools and sources a run was started with, so resume needs no flags (P-30), once signed (P-35).

    A run records its sources' definitions; one started before it did records
    only the config file it named, which is used if it is still there.
    """
    from tether._config import load_config
    from tether._store import open_store

    config = load_config(args.config)
    store = open_store(config.store.url)
    try:
        recorded = trusted_meta(store, store.get_run(args.run_id), lenient=lenient)
    finally:
        store.close()
    return recorded_setup(args, recorded)


def recorded_setup(args: argparse.Namespace, recorded: dict) -> tuple[list[str], str | None, list[dict] | None]:
    """``recorded``: a run's meta that verified (``trusted_meta``), or {}."""
    tools = list(args.tools or recorded.get("tools") or [])
    sources = recorded.get("sources")
    path = recorded.get("config")
    if args.config is None and sources is None and path and Path(path).is_file():
        return tools, path, None
    return tools, args.config, sources


def json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArguments(f"not valid JSON: {exc.msg} at column {exc.colno}",
                               next_action='Quote JSON for the shell, e.g. \'{"ok": true}\' or \'"text"\'.') from None


def print_wait_outcome(out: dict, as_json: bool) -> int:
    if as_json:
        print_json(out)
    else:
        print(out["status"])
        run = out.get("run")
        if run:
            print(f"run {run['run_id']}: {run['status']}")
        if out.get("next_action"):
            print(f"next: {out['next_action']}", file=sys.stderr)
    return EXIT_OK if out["status"] in ("accepted", "already_resolved") else EXIT_FAILED


def home_of(args: argparse.Namespace) -> Path:
    from tether._config import load_config

    return load_config(args.config).home


def ensure_worker(args: argparse.Namespace, tools: Sequence[str]) -> int | None:
    """Start a detached worker for this home unless one is alive: users need not know a runner exists."""
    import subprocess

    from tether._engine.worker import worker_alive
    from tether._store.private import private_dir

    home = home_of(args)
    pid = worker_alive(home)
    if pid is not None:
        return pid
    private_dir(home)  # beside the store: 0700 when made here (P-44)
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


def trusted_meta(store: Store, run: RunRecord | None, *, lenient: bool = False) -> dict[str, Any]:
    """A run's recorded setup (tools, config) once its signature verifies, else nothing (P-35).

    What a run recorded names modules to import and a config to load, so it is
    used only when signed: a tampered run gets no setup here and the runtime
    then ends it ``run_tampered``. A run signed with another secret raises
    ``WrongSecret``, unless ``lenient`` (cancelling needs no setup).
    """
    from tether._engine.approvals.capabilities import keyring_for
    from tether._engine.integrity import verify_run
    from tether._store.states import TERMINAL_RUN_STATUSES
    from tether.errors import RunTampered, WrongSecret

    if run is None or run.status in TERMINAL_RUN_STATUSES:
        return {}
    try:
        verify_run(keyring_for(store), run)
    except RunTampered:
        return {}
    except WrongSecret:
        if lenient:
            return {}
        raise
    return run.meta or {}


def owned_elsewhere(store: Any, run_id: str, principal: str | None, exc: RunNotFound, *,
                    undone: str = "nothing was decided", example: str = "") -> RunNotFound:
    """run_not_found for a run the store holds under another principal: name the owner and the --as to use.

    The command line opens the store itself, so its user is the store's operator:
    telling them who owns a run hides nothing they could not read with `runs show`.
    """
    run = store.get_run(run_id)
    owner = getattr(run, "principal", None) or "local"
    if run is None or owner == (principal or "local"):
        return exc
    example = example or f"tether resume {run_id} --approve --seq N"
    return RunNotFound(
        f"run {run_id} is owned by {owner}, not {principal or 'local'}; {undone}",
        next_action=f"Act for its owner: add --as {owner} (e.g. {example} --as {owner}).",
        details={"run_id": run_id, "owner": owner},
    )

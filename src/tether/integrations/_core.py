"""What the framework adapters share (D-69, D-70): the tool's description, a pause as the deciding person sees
it, what the model reads, and whether a decision that arrived through a framework may be taken.

A framework's approval is a value the host's code builds (``DeferredToolResults``, ``Command(resume=...)``,
``RunState.approve``); the framework cannot say who took it. So tether counts it as a person's only when the
host names that person (``approver``), never the principal that ran the program, and it is held to the rule
of the form a client application shows its user (docs/security.md): never an approval of a write whose
policy rule says ``approver = "signed_in"``. Declining stops things and needs nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence

from tether._engine.approvals.rights import ALLOWED, APPROVE, Access, Channel, Grant, Verdict, may_decide
from tether._engine.approvals.surface import refusal, signed_in_required
from tether._engine.attempt.redaction import shown_args
from tether._engine.lineage.why import why_lines
from tether._engine.rules.run_keys import MAX_RUN_KEY_CHARS, check_run_key
from tether._tools.shown import show_call
from tether.errors import (
    AlreadyDecided,
    InvalidApproval,
    InvalidArguments,
    LimitExceeded,
    NotPaused,
    RunExpired,
    UsageError,
)

if TYPE_CHECKING:
    from tether import RunResult, Runtime

# The name the agent calls: the same as tether's MCP tool, whose description the adapters give it.
TOOL_NAME = "execute"
# What a framework's answer may decide; a cancel is the host's, through Runtime.cancel.
DECISIONS = ("approve", "decline")
# The field of a pause, and of an answer, that names the run (the rest of the framework's data is its own).
RUN_ID = "tether_run_id"


def run_key(origin: str, scope: object, key: str | None, call_id: str | None) -> str:
    """The run key (P-36, D-84) of a framework's tool call: its conversation's (``scope``: a thread, a conversation
    id), with the model's own ``key`` or else the call's id, so a repeat of the call gets its run and another
    conversation's model naming the same key or id reaches none of this one's.

    A model's key tether refuses (too long, not printable) is passed on as it is, so the refusal names the
    model's own key; a composed key past the limit (a long thread id) is the same parts hashed.
    """
    if key:
        try:
            check_run_key(key)
        except InvalidArguments:
            return key
    composed = f"{origin}:{scope}:{'key:' + key if key else call_id}"
    if len(composed) <= MAX_RUN_KEY_CHARS and composed.isprintable():
        return composed
    digest = hashlib.sha256(json.dumps([str(scope), key or None, call_id]).encode()).hexdigest()
    return f"{origin}:{digest}"


def description(rt: Runtime) -> str:
    """What ``tether prompt`` prints: the sandbox API, the limits and the catalog, and how to retry."""
    return rt.engine.model_description()


# Runs being stopped because the framework cancelled the tool call that awaited them: held until stopped.
_STOPPING: set[asyncio.Future[Any]] = set()


async def _cancelled_with_the_call(rt: Runtime, run_id: Callable[[], Awaitable[str | None]],
                                   attempt: Awaitable[RunResult], *, principal: str | None, origin: str) -> RunResult:
    """``attempt``'s result; a framework that cancels the tool call (a timeout, an abandoned agent run, a
    task cancelled) cancels the run (``run_id()``) too, as a cancelled MCP request does (D-84): nothing further is
    sent, a write already on the wire finishes and is journaled (P-8), and the run ends ``cancelled`` rather
    than staying ``running`` in a process that no longer awaits it. The cancellation then goes on to the
    framework. The attempt runs in its own task meanwhile, still the caller's (not stopped as a run begun and
    left when the runtime closes)."""
    task = asyncio.ensure_future(attempt)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stopping = asyncio.ensure_future(_stop(rt, run_id, task, principal=principal, origin=origin))
        _STOPPING.add(stopping)
        stopping.add_done_callback(_STOPPING.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(stopping)  # cancelled again: it still ends, held by _STOPPING
        raise


async def _stop(rt: Runtime, run_id: Callable[[], Awaitable[str | None]], task: asyncio.Future[RunResult], *,
                principal: str | None, origin: str) -> None:
    with contextlib.suppress(Exception):
        named = await run_id()
        if named is None:
            task.cancel()  # no run yet (or none to name): nothing was started to stop
        else:
            await rt.cancel(named, f"the agent framework ({origin}) cancelled the tool call; nothing further was "
                            "sent", principal=principal)
    with contextlib.suppress(BaseException):
        await task


async def start(rt: Runtime, code: str, *, key: str | None, principal: str | None, origin: str,
                user_words: str | Sequence[str] | None = None) -> RunResult:
    """Run the model's program; what refuses to start it (too large, a key naming another program, a
    quota) is a failed envelope the model reads, as over MCP, not an error that ends the host's agent run.
    A tool call the framework cancels cancels its run (``origin`` names the framework in the reason).

    ``user_words`` are the user's messages as the host's framework holds them (D-75, D-76), given only when
    the host opted in; a run its key already names keeps the words it was started with. A value that is not
    the user's messages is the host's mistake, not the model's: it raises (InvalidArguments), no run started.
    """
    from tether._engine.attempt.result import RunResult
    from tether._engine.lineage.words import messages
    from tether._store.states import RunStatus

    messages(user_words)  # the host's mistake raises here, not as the model's failed run; the run keeps the marks
    try:
        async def named() -> str | None:  # the run the key names, once the attempt has created it
            run = await rt.store.aio.get_run_by_key(principal or rt.principal, key) if key else None
            return run.run_id if run is not None else None

        return await _cancelled_with_the_call(rt, named, rt.execute(code, key=key, principal=principal,
                                                                    user_words=user_words),
                                              principal=principal, origin=origin)
    except (UsageError, LimitExceeded) as exc:
        return RunResult(status=RunStatus.FAILED, run_id="", error=exc.to_dict())


def pause_of(rt: Runtime, result: RunResult) -> dict[str, Any]:
    """A paused run as the deciding person is shown it: every undecided write, every argument named.

    ``args`` has secrets hidden by the rule every surface uses (tether/_tools/shown.py) and ``shown`` is
    the call as the console shows it, escaped; no approval key (a capability) is included: this travels
    through the framework's state, its UI and its storage.
    """
    pending = result.pending or {}
    writes = [w for w in (pending.get("writes") or [pending]) if isinstance(w, dict) and w.get("seq") is not None]
    shown = []
    for w in writes:
        if w.get("decision"):
            continue  # decided already; the run waits on the rest of its batch
        address = str(w.get("address"))
        tool = rt.catalog.get(address) if address in rt.catalog else None
        schema = tool.input_schema if tool is not None else None
        args = shown_args(w, schema)
        about = tool.description if tool is not None else None
        # "why": what made lineage ask (writes = "guard", P-45), as every approval surface shows it.
        why = why_lines(w.get("reasons") or (), w.get("args") or {})
        shown.append({"seq": w["seq"], "address": address, "args": args,
                      "annotations": w.get("annotations") or {},
                      "shown": show_call(address, args, description=about, schema=schema).block(),
                      **({"why": why} if why else {})})
    return {RUN_ID: result.run_id, "writes": shown, "expires_at": result.expires_at}


def for_model(result: RunResult) -> dict[str, Any]:
    """The run's envelope as the model reads it: no diagnostics, and a pause without approval keys (D-32)."""
    data = result.to_dict()
    data.pop("diagnostics", None)
    pending = data.get("pending")
    if isinstance(pending, dict):
        data["pending"] = {k: v for k, v in pending.items() if k != "key"}
        if isinstance(pending.get("writes"), list):
            data["pending"]["writes"] = [{k: v for k, v in w.items() if k != "key"} for w in pending["writes"]]
    return data


def answer(pause: Mapping[str, Any], decision: str | bool, *, approver: str | None = None,
           reason: str | None = None) -> dict[str, Any]:
    """A decision on every write ``pause`` shows: what the adapters take back (a resume value, metadata).

    ``approver`` is the person the host established took it (its own sign-in); without one, an approve
    is refused when it arrives.
    """
    verdict = {True: "approve", False: "decline"}.get(decision, decision) if isinstance(decision, bool) else decision
    if verdict not in DECISIONS:
        raise InvalidApproval(f"a decision is 'approve' or 'decline' (or True / False), not {decision!r}; "
                              "nothing was decided")
    return {RUN_ID: pause.get(RUN_ID), "seqs": [w["seq"] for w in pause.get("writes") or []], "decision": verdict,
            "approver": approver, "reason": reason}


def verdict(owner: str, approver: str | None, decision: str, *, signed_in: bool) -> Verdict:
    """May a decision that arrived through a framework be taken on a write of a run ``owner`` ran? (D-69)

    Pure: an approve needs the person the host named (``approver``), who is not the run's own principal,
    and is then what a form answered by the client application's user is (``Channel.FORM``): refused for a
    write whose rule requires a signed-in approver (``signed_in``).
    """
    if decision != "approve":
        return ALLOWED
    # A name is the person's without the blanks around it: blanks alone name nobody, and the run's own
    # principal padded with them is still that principal.
    approver = (approver or "").strip()
    if not approver:
        return Verdict(False, "approval_refused", "an approval through the framework names no person (approver); "
                       "tether does not count it as a person's")
    if approver == owner:
        return Verdict(False, "self_approval", f"{approver} ran this program, and the principal that ran a program "
                       "does not approve its own writes")
    grant = Grant(approver, approver, frozenset({APPROVE}), approves_for=frozenset({owner}))
    return may_decide(Access.of([grant]), grant, owner, decision, Channel.FORM, signed_in_required=signed_in)


async def decide(rt: Runtime, given: Mapping[str, Any], *, code: str | None, origin: str,
                 principal: str | None = None, key: str | None = None) -> RunResult:
    """Take ``given`` (an :func:`answer`) on its run, checked first; the run's next result.

    ``code`` is the program of the framework's tool call the answer arrived with: a run that ran another
    program is not this call's (an answer copied onto another call), and nothing is decided. ``key`` is the
    call's run key (:func:`run_key`): a run this framework started under another key is another call's too.
    """
    run_id, seqs, decision = given.get(RUN_ID), given.get("seqs"), given.get("decision")
    if (not isinstance(run_id, str) or not isinstance(seqs, (list, tuple)) or not seqs
            or not all(type(s) is int for s in seqs) or decision not in DECISIONS):
        # seqs are the pause's own numbers: a string, a bool or a float is no write's seq.
        raise InvalidApproval(f"a decision names the run ({RUN_ID}), its writes (seqs, a list of the pause's "
                              f"write numbers) and 'approve' or 'decline'; got {sorted(map(str, given))}; "
                              "nothing was decided")
    # Off the event loop (D-27): a framework host serves other agents while a Postgres read is slow.
    run = await rt.store.aio.call(rt.engine.get_run, run_id, principal)
    if code is not None and run.program != code:
        raise InvalidApproval(f"run {run_id} ran another program than this tool call's; nothing was decided")
    if key is not None and (run.run_key or "").startswith(f"{origin}:") and run.run_key != key:
        # The same program in another conversation (an answer's metadata mixed up between them). A run
        # keyed otherwise was started before the framework named its runs, and is judged by its program.
        raise InvalidApproval(f"run {run_id} was started by another tool call than this one (another "
                              "conversation's); pass back the metadata of this call's own pause; nothing was decided")
    owner = run.principal or rt.principal
    approver = given.get("approver")
    checked = verdict(owner, approver if isinstance(approver, str) else None, str(decision),
                      signed_in=signed_in_required(run, list(seqs)))
    if not checked.ok:
        raise refusal(checked, run_id, None, paused=True, console=False)
    reason = given.get("reason")
    try:
        # The run continues here: a framework that cancels the call now cancels the run, as for a start.
        async def named() -> str:
            return run_id

        return await _cancelled_with_the_call(rt, named, rt.decide(
            run_id, {s: (decision, reason if isinstance(reason, str) else None) for s in seqs}, principal=principal,
            actor=(approver.strip() or None) if isinstance(approver, str) else None, via="python", origin=origin),
            principal=principal, origin=origin)
    except (AlreadyDecided, NotPaused, RunExpired):
        # Decided elsewhere while the framework held its pause (the console, a link, a cancel, its time to
        # live; D-84): nothing was decided here, and the call's result is the run as it is now (its outcome, or
        # its next pause), not an error the framework's conversation could never get past.
        return await rt.engine.wait_for_run(run_id)

"""A guarded run's lineage at the effect boundary: what an untrusted read journals, and a write's verdict (P-45).

Made for an attempt only when the run's policy says ``writes = "guard"`` (rules/policy.py), so other runs pay
nothing. The boundary asks it two things:

- :meth:`Guard.read_lineage`: the label of a read's tool and the marks of its result (values.marks), which
  the ledger signs with the entry and the store copies into the cross-run index (``lineage_marks``);
- :meth:`Guard.verdict`: must this write wait for a person, and why — ``judge()`` (judge.py) given the
  program's flow, the untrusted reads of this run's journal, the untrusted marks this principal's earlier runs
  were given (the same session, or within ``[policy] lineage_window_seconds`` before this run was created), the
  values trusted reads of this run returned, the user's words the host gave with the run (words.py) and the
  policy's allowlist.

Every input is the run's program, its signed journal and index rows written before the run was created, so a
resume in another process, or after a restart, judges a write it reaches the same way; a write judged once
keeps its verdict in its own journal entry (replay answers from it, never judging again).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
from json.encoder import encode_basestring_ascii as _stored  # a string as the store's JSON writes it
from typing import TYPE_CHECKING, Any, Mapping

from tether._engine.integrity import verify_calls
from tether._engine.lineage.flow import UNKNOWN, DataFlow, analyse
from tether._engine.lineage.judge import LineageVerdict, Origin, Reason, judge, lookups
from tether._engine.lineage.trust import TRUSTED, UNTRUSTED, Labels, ToolTrust
from tether._engine.lineage.values import marks
from tether._engine.lineage.words import origins
from tether._hostwork import off_loop
from tether._store.base import LOCAL_PRINCIPAL, CallRecord
from tether._store.states import CallState
from tether._tools.params import parameters
from tether.errors import HostWorkTimeout

if TYPE_CHECKING:
    from tether._engine.approvals.capabilities import Keyring
    from tether._engine.rules.policy import Policy
    from tether._store.base import AsyncStore, RunRecord
    from tether._tools.model import Tool

# Characters of marks one read journals, as stored (values.marks keeps 256 of any length; a link may be 2,000
# characters):
# what the entry adds to the journal stays small beside the result it describes (P-22).
MARKS_CHARS = 16_384
# How long judging one write may take (the static pass of its program included, cached after): far past what a
# 100 KiB program and 64 arguments take, short enough that a stuck judgement does not hold a run.
JUDGE_SECONDS = 2.0
# Trusted results whose values one attempt keeps in memory to say "a trusted result holds it".
TRUSTED_RESULTS = 1000


class Guard:
    """What one attempt of a guarded run judges its writes with."""

    def __init__(self, *, run: "RunRecord", policy: "Policy", labels: Labels, astore: "AsyncStore",
                 keyring: "Keyring") -> None:
        self.run_id = run.run_id
        self.program = run.program
        # A REPL session's later execute starts from the globals earlier ones left (P-21): their values are
        # results the static pass of this program cannot see.
        self.continues_session = bool(run.session and (run.meta or {}).get("session_base"))
        self.principal = run.principal or LOCAL_PRINCIPAL
        self.session = run.session
        self.created_at = run.created_at
        self.policy = policy
        self.labels = labels
        self.astore = astore
        self.keyring = keyring
        self._flow: DataFlow | None = None
        self._earlier: dict[int, CallRecord] | None = None  # entries before the attempt's, read once
        self._trusted: dict[int, dict[str, Origin]] = {}  # seq -> the norms of a trusted read's result
        # What the user's words hold (D-75): signed with the run, so every attempt trusts the same values.
        self._said = origins(run.meta)

    # -- reads ---------------------------------------------------------------------------------------------

    def read_lineage(self, address: str, value: Any) -> dict[str, Any] | None:
        """An untrusted read's label and the marks of its result, as its journal entry keeps them; None for a
        trusted one (its values are read back from its outcome when a write needs them)."""
        trust = self.labels.of(address)
        if not trust.untrusted:
            return None
        kept, room = [], MARKS_CHARS
        for m in marks(value):
            if trust.label_at(m.path) != UNTRUSTED:
                continue
            # Counted as the journal stores it (``["kind","norm","path"],``): a character the JSON escapes weighs
            # six, so a result of one-character quoted CJK values cannot make the entry six times the bound.
            room -= len(_stored(m.kind)) + len(_stored(m.norm)) + len(_stored(m.path)) + 5
            if room < 0:
                break
            kept.append([m.kind, m.norm, m.path])
        return {"trust": UNTRUSTED, "marks": kept}

    # -- writes --------------------------------------------------------------------------------------------

    @property
    def flow(self) -> DataFlow:
        if self._flow is None:
            program = self.program
            if self.continues_session:
                # Each name the program reads without binding it holds what an earlier execute left: the pass
                # sees it as the result of one more (untrusted) tool, so whatever derives from it is followed.
                free = _free_names(program)
                if len(free) > MAX_SESSION_NAMES:
                    self._flow = UNKNOWN  # past the cap: every argument "cannot tell"
                    return self._flow
                if free:
                    program = "import tools\n" + "".join(f"{n} = await tools.{SESSION_ADDRESS}()\n" for n in free) \
                        + program
            self._flow = analyse(program)
        return self._flow

    async def verdict(self, seq: int, tool: "Tool", args: dict[str, Any],
                      journal: Mapping[int, CallRecord]) -> LineageVerdict:
        """The verdict on write ``seq`` of ``tool`` with validated ``args``, from the calls before it."""
        entries = await self._entries(journal)
        called: dict[str, Origin] = {}
        untrusted: dict[str, Origin] = {}
        trusted: dict[str, Origin] = dict(self._said)
        for s in sorted(entries):
            if s >= seq:
                break
            entry = entries[s]
            # A read, or a guarded read asked and sent as a write (its state is then "sent").
            if entry.op != "tool" or entry.state not in (CallState.DONE, CallState.SENT):
                continue
            lineage = entry.lineage
            if isinstance(lineage, dict) and lineage.get("trust") == UNTRUSTED:
                called[entry.address] = Origin(entry.address, self.run_id, s)
                for mark in lineage.get("marks") or ():
                    if isinstance(mark, list) and len(mark) == 3:
                        untrusted.setdefault(str(mark[1]), Origin(entry.address, self.run_id, s, str(mark[2]),
                                                                  str(mark[0])))
                # A tool labelled trusted but for a field (trust_fields, D-73): what its trusted fields hold is a
                # trusted result's, as a trusted tool's is; its untrusted fields' marks above still ask.
                trust = self.labels.of(entry.address)
                if entry.kind == "read" and (trust.label == TRUSTED or any(lb == TRUSTED for _, lb in trust.fields)):
                    for norm, origin in self._trusted_norms(entry, trust).items():
                        trusted.setdefault(norm, origin)
            elif entry.kind == "read":
                for norm, origin in self._trusted_norms(entry).items():
                    trusted.setdefault(norm, origin)
        if self.continues_session:
            called[SESSION_ADDRESS] = Origin(SESSION_ADDRESS, self.run_id)
        norms = [n for n in lookups(args) if n not in untrusted]
        if norms:
            window = self.policy.lineage_window_seconds
            for row in await self.astore.lineage_marks(self.principal, norms, before=self.created_at,
                                                        since=self.created_at - window, session=self.session):
                untrusted.setdefault(row.norm, Origin(row.address, row.run_id, row.seq, row.path, row.kind))
        try:
            # Host work with a deadline, off the event loop: the pass over a long program and the judging of
            # many arguments are bounded, but not free.
            return await off_loop(self._judge, tool, args, called, untrusted, trusted, seconds=JUDGE_SECONDS,
                                  what=f"judging the lineage of {tool.address}")
        except HostWorkTimeout:
            # Not judged: the conservative answer is a person's.
            return LineageVerdict(True, (Reason("", f"its lineage could not be judged within {JUDGE_SECONDS:g} s, so "
                                                    "a person decides", None, True, asks=True),))

    def _judge(self, tool: "Tool", args: dict[str, Any], called: dict[str, Origin], untrusted: dict[str, Origin],
               trusted: dict[str, Origin]) -> LineageVerdict:
        verdict = judge(address=tool.address, input_schema=tool.input_schema, args=args, flow=self.flow,
                        untrusted_called=called, untrusted_values=untrusted, trusted_values=trusted,
                        allowlist=self.policy.allowlist, role_overrides=self.labels.roles_of(tool.address),
                        positional=parameters(tool).positional, run_id=self.run_id)
        if not self.continues_session:
            return verdict
        said = f"the result of {SESSION_ADDRESS}()"
        shown = f"a value an earlier execute of session {self.session} left in a name"
        return LineageVerdict(verdict.ask, tuple(dataclasses.replace(r, says=r.says.replace(said, shown))
                                                 for r in verdict.reasons))

    def _trusted_norms(self, entry: CallRecord, trust: ToolTrust | None = None) -> dict[str, Origin]:
        """What a trusted read's result holds, norm -> where (the judge names it: "your contacts hold it");
        given ``trust``, only what its trusted fields hold."""
        held = self._trusted.get(entry.seq)
        if held is None:
            held = {}
            if len(self._trusted) < TRUSTED_RESULTS:
                for m in marks(entry.outcome):
                    if trust is None or trust.label_at(m.path) == TRUSTED:
                        held.setdefault(m.norm, Origin(entry.address, self.run_id, entry.seq, m.path, m.kind))
            self._trusted[entry.seq] = held
        return held

    async def _entries(self, journal: Mapping[int, CallRecord]) -> Mapping[int, CallRecord]:
        """The run's entries before this attempt's too: a restored attempt holds only the journal's tail. Read
        once, and verified (P-35) like every entry a resume acts on."""
        if not journal or min(journal) <= 1:
            return journal
        if self._earlier is None:
            earlier = await self.astore.get_calls(self.run_id)
            verify_calls(self.keyring, self.run_id, earlier)
            self._earlier = {e.seq: e for e in earlier}
        return {**self._earlier, **journal}


# The pseudo tool a session's earlier executes stand for in the static pass (no namespace can be spelled so).
SESSION_ADDRESS = "__session__.globals"
# Names a program reads that are the sandbox's own, never a session's globals (tools/stubs.py's prelude).
_SANDBOX_NAMES = frozenset(dir(builtins)) | {"tools", "search", "describe", "sources", "emit", "yield_control",
                                            "wait_for", "wait_for_signal", "sleep"}


def _free_names(code: str) -> list[str]:
    """Names ``code`` reads and never binds: a session's globals. Over-counting only makes more writes ask."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound |= set(node.names)
    return sorted(read - bound - _SANDBOX_NAMES)


# Names of a session's globals one program is given as reads of earlier executes (a program reads a few; past
# this many the pass is not asked at all).
MAX_SESSION_NAMES = 256

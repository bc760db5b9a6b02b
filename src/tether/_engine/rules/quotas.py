"""Per-principal quotas ([quotas]): checked before or as a run is created, so a refusal leaves nothing written.

Each quota bounds what one principal (one token; ``local`` without one) may
hold or start, so one agent cannot crowd out the others sharing a server:

* ``concurrent_runs`` — runs queued or running at once;
* ``runs_per_period`` — runs started per ``period_seconds``;
* ``stored_bytes`` — what its runs (journals, snapshots, events) and REPL
  sessions hold in the store (measured at most every STORED_BYTES_TTL
  seconds: an estimate, like retention's, never a scan per start);
* ``repl_sessions`` — REPL sessions kept (a run may continue one it has;
  a new name past the quota is refused);
* ``mcp_sessions`` — MCP sessions open over HTTP (tether._server.auth).

``concurrent_runs`` and ``runs_per_period`` are checked where the run is
recorded, in its transaction, when ``runs_per_period`` is set (D-54:
:class:`CountedStart`); the rest before. ``runs_per_period`` counts per-bucket
counters, not runs: its cost does not grow with the runs of the period, and
the count may include runs up to period/60 older than the window (never
fewer than the exact count).

A refusal is :class:`~tether.errors.QuotaExceeded` naming the quota, its
limit, the use, and what to do. A keyed retry of a run that exists (P-36) is
never refused: it starts nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

from tether._store import usage
from tether._store.base import LOCAL_PRINCIPAL, RunRecord, Store
from tether.errors import QuotaExceeded

# Measuring a principal's bytes reads every row it owns; once a minute per principal is plenty for a
# quota meant to stop runaway growth over hours.
STORED_BYTES_TTL = 60.0


@dataclass(frozen=True)
class Quota:
    """One principal's limits; None is unlimited."""

    concurrent_runs: int | None = None
    runs_per_period: int | None = None
    period_seconds: float = 3600.0
    stored_bytes: int | None = None
    repl_sessions: int | None = None
    mcp_sessions: int | None = None


@dataclass
class Quotas:
    """The default quota and per-principal overrides; checks a start against them."""

    default: Quota = field(default_factory=Quota)
    principals: Mapping[str, Quota] = field(default_factory=dict)
    stored_bytes_ttl: float = STORED_BYTES_TTL
    _bytes: dict[str, tuple[float, int]] = field(default_factory=dict)

    def of(self, principal: str) -> Quota:
        return self.principals.get(principal, self.default)

    def longest_period(self) -> float:
        """The longest window a start here counts runs in (0.0: no quota counts them); what the runner's
        maintenance keeps quota counters for (usage.forget_counts)."""
        counted = [q.period_seconds for q in (self.default, *self.principals.values()) if q.runs_per_period is not None]
        return max(counted, default=0.0)

    def reads_store(self, principal: str, session: str | None) -> bool:
        """Whether :meth:`check_start` reads the store for this start (else it only returns a CountedStart)."""
        q = self.of(principal)
        return ((q.concurrent_runs is not None and q.runs_per_period is None) or q.stored_bytes is not None
                or (session is not None and q.repl_sessions is not None))

    def check_start(self, store: Store, principal: str, now: float, *,
                    session: str | None = None) -> CountedStart | None:
        """Raise QuotaExceeded if ``principal`` may not start a run now (with ``session``, if named).

        With ``runs_per_period`` set, the runs counts are made where the run is recorded: the
        :class:`CountedStart` returned, for ``Lifecycle.create``. None: nothing left to count there.
        """
        q = self.of(principal)
        counted = None
        if q.runs_per_period is not None:
            counted = CountedStart(q, now - q.period_seconds)
        elif q.concurrent_runs is not None:
            _check_active(q, usage.active_runs(store, principal))
        if q.stored_bytes is not None:
            used = self._stored(store, principal)
            if used >= q.stored_bytes:
                raise _refused("stored_bytes", q.stored_bytes, used,
                               f"this principal's runs and sessions hold about {used} bytes in the store",
                               "Ask the operator to prune ended runs (tether runs prune) or to shorten "
                               "[retention]; reset REPL sessions you no longer need.")
        if session is not None and q.repl_sessions is not None:
            kept = usage.repl_sessions(store, principal, now)
            if session not in kept and len(kept) >= q.repl_sessions:
                raise _refused("repl_sessions", q.repl_sessions, len(kept),
                               f"this principal keeps {len(kept)} REPL sessions and {session!r} would be a new one",
                               "Continue one of your sessions, or reset one you no longer need "
                               "(tether sessions reset NAME).")

        return counted

    def _stored(self, store: Store, principal: str) -> int:
        at, n = self._bytes.get(principal, (0.0, 0))
        if not at or time.monotonic() - at >= self.stored_bytes_ttl:
            n = usage.stored_bytes(store, principal)
            self._bytes[principal] = (time.monotonic(), n)
        return n


@dataclass(frozen=True)
class CountedStart:
    """A start's runs counts, made in the transaction that records the run (D-54).

    The count and the insert under one lock: a start checked apart from its insert let two replicas
    both take a principal's last slot. ``runs_per_period`` is counted from buckets (a conservative
    count, see tether._store.usage); ``concurrent_runs`` rides in the same statement for free.
    """

    quota: Quota
    since: float

    def create(self, store: Store, run: RunRecord) -> None:
        """Record ``run`` unless its principal is past a quota; refused, nothing is written."""
        usage.create_counted(store, run, self.since, usage.bucket_width(self.quota.period_seconds), self.admit)

    def admit(self, active: int, started: int) -> None:
        q = self.quota
        _check_active(q, active)
        if q.runs_per_period is not None and started >= q.runs_per_period:
            raise _refused("runs_per_period", q.runs_per_period, started,
                           f"this principal started {started} runs in the last {q.period_seconds:g} s (counted "
                           f"in steps of {usage.bucket_width(q.period_seconds):g} s)",
                           f"Start it again later (the window is {q.period_seconds:g} s), or batch more "
                           "work into each run.")


def _check_active(q: Quota, used: int) -> None:
    if q.concurrent_runs is not None and used >= q.concurrent_runs:
        raise _refused("concurrent_runs", q.concurrent_runs, used,
                       f"{used} runs of this principal are queued or running",
                       "Wait for one to end (or cancel one), then start this again.")


def check_run_start(quotas: Quotas | None, store: Store, run: RunRecord, session: str | None,
                    now: float) -> CountedStart | None:
    """Refuse ``run``'s start past its principal's quotas, before anything is written; what is left to
    count where the run is recorded (``Lifecycle.create``), or None.

    A keyed request whose key already names a run (P-36) starts nothing, so it is never refused.
    """
    principal = run.principal or LOCAL_PRINCIPAL
    if quotas is None or (run.run_key and store.get_run_by_key(principal, run.run_key)):
        return None
    return quotas.check_start(store, principal, now, session=session)


def _refused(quota: str, limit: int, used: int, why: str, next_action: str) -> QuotaExceeded:
    return QuotaExceeded(f"{why}; its {quota} quota is {limit}; nothing was started", next_action=next_action,
                         details={"quota": quota, "limit": limit, "used": used})


__all__ = ["CountedStart", "Quota", "Quotas", "STORED_BYTES_TTL", "check_run_start"]

"""Limits in force for a run, as one value object recorded on the run.

The one declaration of the limits: ``[limits]`` in tether.toml parses straight into :class:`Limits` (its fields'
types check each key, tether._fields), and the engine runs with that value. A Python caller builds it the same
way, checked the same way (``__post_init__``: by hand, then by pydantic when that fails, tether._fields.recheck).
"""

# No `from __future__ import annotations`: the fields' types are objects, not names, so pydantic checks
# this class wherever it is used without looking names up in its module (which reads `tether` once
# tether/__init__.py renames __module__).

import dataclasses
from typing import Any

from tether._fields import PositiveInt, Seconds, positive_int, recheck, seconds

_SECONDS = frozenset({"run_seconds", "call_timeout_seconds", "max_sleep_seconds", "key_backoff_seconds"})


@dataclasses.dataclass(frozen=True)
class Limits:
    # How pydantic checks this class as [limits] (the config's model) or in recheck(): unknown keys refused.
    __pydantic_config__ = {"extra": "forbid"}

    # 64 KiB: longer model-written programs are nearly always data pasted into
    # literals, which belongs in tool calls (connecta uses the same cap).
    code_bytes: PositiveInt = 65_536
    # 64 MiB of sandbox heap: tens of thousands of records as dicts fit; a pool
    # of workers still fits a small container (executor's QuickJS cap is the same).
    memory_bytes: PositiveInt = 64 * 1024 * 1024
    # Interpreter time only, host calls excluded so a slow tool cannot use up
    # the run; 60 s is ~400M loop iterations, far beyond any honest reduce step.
    run_seconds: Seconds = 60.0
    # 50 host calls: room to fan out over a page of results (connecta allows 20),
    # well under Monty's default ceiling of 1000 suspensions; more should page or reduce upstream.
    host_calls: PositiveInt = 50
    # 15 s per call: long enough for a slow API, short enough that a hung tool
    # frees its worker before the caller gives up (connecta's per-call figure).
    call_timeout_seconds: Seconds = 15.0
    # 30,000 characters (~7.5k tokens of preview): what a model can read back
    # without losing the thread; executor truncates at the same size.
    result_bytes: PositiveInt = 30_000
    # print() output shares the result's context budget, so the same size.
    log_bytes: PositiveInt = 30_000
    # CPython's and Monty's default, so recursion behaves as the model expects.
    recursion_depth: PositiveInt = 1000
    # 1 MiB per journaled value (a call's arguments, or its outcome): a tool
    # result the program can still reduce, far below the sandbox heap; a value
    # over it fails its call instead of filling the store (Cloudflare's code
    # mode caps each logged value at the same 1 MB).
    journal_value_bytes: PositiveInt = 1024 * 1024
    # 64 MiB of journal per run: ~60 calls at the per-value cap, or thousands
    # of ordinary ones; past it the run ends (journal_limit).
    journal_bytes: PositiveInt = 64 * 1024 * 1024
    # 30 days per durable sleep: longer is a bug (a sleep of 10**9 s parked a
    # run for 31 years), not a schedule; it fails with sleep_too_long instead.
    max_sleep_seconds: Seconds = 30 * 86400.0
    # A write to a tool that dedupes by idempotency key is sent at most this
    # many times while its outcome is unknown (P-31); across crashes too.
    key_sends: PositiveInt = 5
    # The pause before the first re-send; it doubles with each send, up to 5 s.
    key_backoff_seconds: Seconds = 0.2
    # A run whose attempts end this many times in a row with its process gone
    # (a crash, a hang killed, a lease lost) is ended run_quarantined instead
    # of being taken over again (P-39): one program must not take down every
    # replica in turn. Three: a deploy or two may interrupt an honest run.
    quarantine_after: PositiveInt = 3

    def __post_init__(self) -> None:
        if not all(seconds(self, k) if k in _SECONDS else positive_int(v) for k, v in list(self.__dict__.items())):
            recheck(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Limits":
        """The limits a run recorded; keys this version does not know (or no longer has) are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> "Limits":
        return dataclasses.replace(self, **changes)

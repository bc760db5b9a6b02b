"""Limits in force for a run, as one value object recorded on the run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    # 64 KiB: a program is instructions, not data; larger inputs belong in tool calls.
    code_bytes: int = 65_536
    # 64 MiB of sandbox heap: ample for reducing tool results, small enough to keep a pool cheap.
    memory_bytes: int = 64 * 1024 * 1024
    # Wall time of the program's own execution; time inside host calls does not count.
    run_seconds: float = 60.0
    # 50 host calls: a program that needs more should page or reduce upstream.
    host_calls: int = 50
    # 15 s per call: an interactive agent cannot wait longer for one answer.
    call_timeout_seconds: float = 15.0
    # 30,000 characters: about what an agent can read back without drowning its context.
    result_bytes: int = 30_000
    log_bytes: int = 30_000
    recursion_depth: int = 1000
    # 1 MiB per journaled value (a call's arguments, or its outcome): a tool
    # result the program can still reduce, far below the sandbox heap; a value
    # over it fails its call instead of filling the store (Cloudflare's code
    # mode caps each logged value at the same 1 MB).
    journal_value_bytes: int = 1024 * 1024
    # 64 MiB of journal per run: ~60 calls at the per-value cap, or thousands
    # of ordinary ones; past it the run ends (journal_limit).
    journal_bytes: int = 64 * 1024 * 1024
    # 30 days per durable sleep: longer is a bug (a sleep of 10**9 s parked a
    # run for 31 years), not a schedule; it fails with sleep_too_long instead.
    max_sleep_seconds: float = 30 * 86400.0
    # A write to a tool that dedupes by idempotency key is sent at most this
    # many times while its outcome is unknown (P-31); across crashes too.
    key_sends: int = 5
    # The pause before the first re-send; it doubles with each send, up to 5 s.
    key_backoff_seconds: float = 0.2
    # A run whose attempts end this many times in a row with its process gone
    # (a crash, a hang killed, a lease lost) is ended run_quarantined instead
    # of being taken over again (P-39): one program must not take down every
    # replica in turn. Three: a deploy or two may interrupt an honest run.
    quarantine_after: int = 3

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Limits":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> "Limits":
        return dataclasses.replace(self, **changes)

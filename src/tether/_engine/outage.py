"""What a worker says while its store keeps failing, and how long its rounds wait meanwhile (D-92).

A worker's round touches the store a few times (expiries, claims, the settled-wait scan); a store that is down
fails every one of them, every round. Said each time, a minute's outage at ~0.2 s a round floods stderr with
hundreds of lines that say the same thing. So a failure is said once, with its code, when it first happens in an
outage; its repeats are counted and summarised now and then; rounds back off while the store fails (doubling up to
``MAX_BACKOFF_SECONDS``); and the first round the store answers is said, after which rounds run at their usual
pace at once, so a queued run waits at most one backoff (a few seconds) once the store is back.

Pure bookkeeping, no I/O: the worker prints the lines it returns; time is the engine's injectable clock.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

# The longest pause between a failing store's rounds: also the longest a queued run waits once the store is back.
MAX_BACKOFF_SECONDS = 5.0
# How often repeats of a failure already said are summarised while the store keeps failing.
SUMMARY_SECONDS = 60.0


def _code(exc: Exception) -> tuple[str, str]:
    from tether.errors import TetherError

    return (exc.code, exc.message) if isinstance(exc, TetherError) else (type(exc).__name__, str(exc))


def _hms(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


@dataclasses.dataclass
class Outage:
    """One worker's view of its store failing: what was said, what repeated since, how long rounds wait."""

    clock: Callable[[], float]
    since: float | None = None  # when this outage's first failure was seen; None while the store answers
    rounds: int = 0  # failed rounds in a row
    summarised_at: float = 0.0
    failed_now: bool = False  # whether the round under way has failed
    # (what failed, its code) -> its repeats in this outage after the first, in the order first seen
    repeats: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)

    def failed(self, what: str, exc: Exception) -> str | None:
        """Note a failure of this round; the line to say now, or None for a repeat (counted, summarised later)."""
        code, message = _code(exc)
        now = self.clock()
        if self.since is None:
            self.since = self.summarised_at = now
        self.failed_now = True
        if (what, code) in self.repeats:
            self.repeats[(what, code)] += 1
            return None
        self.repeats[(what, code)] = 0
        return (f"tether worker: {what} failed [{code}]: {message}; trying again, rounds backing off up to "
                f"{MAX_BACKOFF_SECONDS:g} s while the store fails")

    def round_ended(self, poll_seconds: float) -> tuple[float, list[str]]:
        """Seconds until the next round, and lines to say: a summary of repeats now and then, or the recovery."""
        failed, self.failed_now = self.failed_now, False
        if not failed:
            if self.since is None:
                return poll_seconds, []
            line = (f"tether worker: the store answers again after {self.rounds} failed round"
                    f"{'s' if self.rounds != 1 else ''} since {_hms(self.since)}; rounds back to every "
                    f"{poll_seconds:g} s")
            self.since, self.rounds, self.repeats = None, 0, {}
            return poll_seconds, [line]
        self.rounds += 1
        delay = min(poll_seconds * 2 ** self.rounds, max(MAX_BACKOFF_SECONDS, poll_seconds))
        now = self.clock()
        if now - self.summarised_at < SUMMARY_SECONDS or self.since is None:
            return delay, []
        self.summarised_at = now
        lines = [f"tether worker: {what} failed again {n} time{'s' if n != 1 else ''} [{code}] since "
                 f"{_hms(self.since)}; rounds every {delay:g} s" for (what, code), n in self.repeats.items() if n]
        return delay, lines

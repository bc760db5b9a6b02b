"""A/B of issue 24's session-8 changes to the end of a run, in one process, paired.

Not a benchmark run by run_all.py: a one-off measurement kept so the figures in bench/README.md ("Issue 24,
session 8: the end of a run") can be taken again. The harness is ab_session7.py's (the old behaviour swapped
back in on alternate executes of one warm runtime, bare Monty in the same rounds, p50s and the paired ratio);
only the changes differ. It reaches into private names, so it breaks (loudly) when they are renamed.

    python bench/ab_session8.py [--rounds 400] [--calls 0|10] [--store memory|file] [--settled]
    ONLY=entrymac python bench/ab_session8.py ...   # one alone (the others on)

``entrymac``: a journal entry's MAC put together from the texts its row takes (D-58).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import ab_session7 as harness
from tether._engine import integrity
from tether._engine.approvals.capabilities import Keyring
from tether._engine.calls.ledger import Ledger
from tether._engine.finish import Finisher
from tether._store.base import CallRecord

# -- main's behaviour at 6061d9b, for "before" -----------------------------------------------------


def _sign_before(self: Ledger, record: CallRecord) -> None:
    """6061d9b, for a result under 256 characters (every one here): the row takes the boundary's text of the
    outcome and encodes the arguments itself; the MAC encodes every signed field again."""
    record.texts = self._texts.pop(record.seq, None)
    prev = (self._prev_key(record.seq) or "-")[:16]
    mac = Keyring.mac(self.keyring.current, "call", prev, *integrity.signed_call_fields(record))
    record.mac = f"{self.keyring.current_id}:{prev}:{mac}"


# name -> (object, attribute, the value before). Each is put back by switch(on=False).
CHANGES: dict[str, tuple[Any, str, Any]] = {
    "entrymac": (Ledger, "_sign", _sign_before),
}


_ENDS: dict[bool, list[int]] = {True: [], False: []}  # end_attempt's wall ns, by whether the change was on
_MODE = [True]


def _timing_the_end() -> None:
    """Time ``Finisher.end_attempt`` (the journal batch signed, the end's transaction) apart, by mode: the
    piece the changes are in, paired as the executes are, without the rest of an execute's noise."""
    switch, end_attempt = harness.switch, Finisher.end_attempt

    def switched(on: bool) -> None:
        _MODE[0] = on
        switch(on)

    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return await end_attempt(self, *args, **kwargs)
        finally:
            _ENDS[_MODE[0]].append(time.perf_counter_ns() - t)

    harness.switch = switched
    Finisher.end_attempt = timed  # type: ignore[method-assign]


def main() -> None:
    _timing_the_end()
    harness.NAME = "ab_session8"
    harness.ONLY = os.environ.get("ONLY", "all")
    harness.CHANGES.clear()
    harness.CHANGES.update(CHANGES)
    harness._AFTER.clear()
    harness._AFTER.update({name: owner.__dict__[attr] for name, (owner, attr, _old) in CHANGES.items()})
    harness.main()
    after, before = _ENDS[True], _ENDS[False]
    paired = statistics.median(a / b for a, b in zip(after, before))
    print(f"  Finisher.end_attempt p50 µs (every execute, warm-up included): before "
          f"{statistics.median(before) / 1000:.1f}  after {statistics.median(after) / 1000:.1f}  paired {paired:.3f}")


if __name__ == "__main__":
    main()

"""``sign_run`` / ``verify_run`` in format 1 and format 2 (D-55), interleaved in one process, paired.

Not run by run_all.py: a microbenchmark kept so the figures in bench/README.md ("Issue 24, session 7: the run
signature's set of fields") can be taken again. The records are a plain execute's run (5 of 14 fields hold a
value) and a paused one (7), as ``launcher.new_run`` and the pause make them; each verify is of a record read
back (a plain dict MAC, checked in full), not one signed here (D-45's fast path, unchanged).

    python bench/ab_run_signature.py [--rounds 30] [--n 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from tether._engine.approvals.capabilities import Keyring
from tether._engine.integrity import sign_run, verify_run
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy
from tether._store.base import RunRecord
from tether._store.states import RunStatus


def record(paused: bool) -> RunRecord:
    run = RunRecord("run_0123456789abcdef", RunStatus.RUNNING, "import tools\nx = 1\n" * 5,
                    {"clock": "2026-12-02T07:00:00+00:00", "seed": 1234567890123}, Policy().to_dict(),
                    Limits().to_dict(), 0.0, 0.0, principal="local", meta={"check": "calls"})
    if paused:
        run.pending = {"seq": 2, "address": "helpdesk.close_ticket", "args": {"id": 1}, "writes": [{"seq": 2}]}
        run.expires_at = 1.8e9
    return run


def per_call(fn: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    ring = Keyring(os.urandom(32))
    for paused in (False, True):
        run = record(paused)
        read = {v: RunRecord(**{**run.__dict__, "mac": dict(sign_run(ring, run, v))}) for v in (1, 2)}
        times: dict[str, list[float]] = {f"{op} {v}": [] for op in ("sign", "verify") for v in (1, 2)}
        for _ in range(args.rounds):
            for v in (1, 2):  # alternated within a round: the pair sees the same load
                times[f"sign {v}"].append(per_call(lambda v=v, run=run: sign_run(ring, run, v), args.n))
                times[f"verify {v}"].append(per_call(lambda v=v, read=read: verify_run(ring, read[v]), args.n))
        p50 = {k: statistics.median(t) for k, t in times.items()}
        print(f"{'paused' if paused else 'plain'} run ({len(dict(read[2].mac or {})['fields'])} field MACs): "
              + ", ".join(f"{op} {p50[op + ' 1']:.1f} -> {p50[op + ' 2']:.1f} us ({p50[op + ' 2'] / p50[op + ' 1']:.3f}x)"
                          for op in ("sign", "verify")))
    print(f"rounds {args.rounds} x {args.n}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Run a module as ``__main__`` with every Python thread's name given to the OS thread (Linux ``prctl``).

Python 3.11 leaves every thread's ``/proc/PID/task/TID/comm`` as the process's
name, so a CPU split by thread cannot tell the event loop from the store's
threads. Started as ``python bench/named_threads.py tether.cli serve ...``, a
thread named ``tether-store_0`` shows as that (15 bytes at most) and
pg_serve_probe.py can add up each kind's CPU. Measuring only: nothing in
tether depends on it.
"""

from __future__ import annotations

import ctypes
import runpy
import sys
import threading

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)
_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named(self: threading.Thread) -> None:
    _libc.prctl(_PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]

if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

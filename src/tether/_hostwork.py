"""Host work that cannot hold the event loop: CPU-heavy steps leave it with a deadline, and a watchdog measures lag.

One program's ``describe()`` once spun the server's event loop forever: no
limit fired (they are all awaited on that loop), ``/healthz`` stopped
answering and SIGTERM was ignored. Two rules keep that from coming back:

- ``off_loop(fn, ..., seconds=, what=)`` runs a synchronous step (search,
  describe, stub and check building, spec parsing) on a small thread pool of
  its own and waits for it at most ``seconds``. Past that the caller gets
  ``HostWorkTimeout`` (``host_work_timeout``) and goes on; the loop was never
  held. A Python thread cannot be stopped, so an overrunning step keeps its
  thread until it ends: the pool is small so that such steps queue (and time
  out) instead of multiplying, and everything passed through here is meant to
  end (describe's cuts are one pass, search is linear in the catalog).
- ``LoopWatchdog`` is a thread that asks the loop to answer every
  ``interval`` seconds. When an answer is late past ``threshold`` the loop is
  stuck: it logs once which run and call the loop is executing (read from the
  loop thread's frames) and ``stuck`` stays true until the loop has answered
  on time again; ``/readyz`` reports it (docs/deploy.md).
- ``GraceOnSignal``: SIGTERM asks the process to stop, and a thread ends it
  after the grace period if the loop never lets it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tether.errors import HostWorkTimeout

T = TypeVar("T")
log = logging.getLogger("tether.hostwork")

class _Workers:
    """Daemon threads taking host work from a queue.

    Not a ThreadPoolExecutor: the interpreter joins those threads at exit, so
    one step that never ends would keep a stopped server from exiting.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((future, functools.partial(fn, *args, **kwargs)))
        with self._lock:
            if len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, name=f"tether-hostwork-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            future, work = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue  # abandoned before it started
            _job.future = future
            try:
                future.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(exc)
            finally:
                _job.future = None


# The job a host-work thread is running, so long loops in it can see it was abandoned.
_job = threading.local()


def checkpoint() -> None:
    """In a step run by ``off_loop``: stop here if its caller has stopped waiting for it.

    A thread cannot be stopped from outside; a step with a long loop of its own
    (describe() over many addresses) calls this each time round so that an
    abandoned step frees its thread instead of running to the end.
    """
    future = getattr(_job, "future", None)
    if future is not None and getattr(future, "abandoned", False):
        raise HostWorkTimeout("abandoned host work stopped at a checkpoint")


# Two threads: one overrunning step leaves the other for everyone else, and
# more would only share the same GIL.
_POOL = _Workers(2)


async def off_loop(fn: Callable[..., T], *args: Any, seconds: float, what: str, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the host-work threads; ``HostWorkTimeout`` if it takes longer than ``seconds``."""
    future = _POOL.submit(fn, *args, **kwargs)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), max(seconds, 0.001))
    except TimeoutError:
        if not future.cancel():  # not started yet (the threads were busy): it never will be
            future.abandoned = True  # type: ignore[attr-defined]  # running: its next checkpoint() ends it
        raise HostWorkTimeout(
            f"{what} did not finish within {seconds:.3g} s of host time and was abandoned; nothing was sent",
            details={"what": what, "seconds": round(seconds, 3)},
        ) from None


class LoopWatchdog:
    """Measures the event loop's lag from a thread: the loop cannot report that it is stuck, a thread can."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, threshold: float = 2.0, interval: float = 0.25,
                 report: Callable[[str], None] | None = None) -> None:
        self.loop, self.threshold, self.interval = loop, threshold, interval
        self.report = report or log.warning
        self.lag = 0.0  # seconds the latest (or the outstanding) beat has waited
        self.stuck = False
        self._loop_thread = threading.get_ident() if _running(loop) else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tether-loop-watchdog", daemon=True)

    def start(self) -> LoopWatchdog:
        self._loop_thread = self._loop_thread or threading.get_ident()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            answered = threading.Event()
            sent = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed: nothing left to watch
                return
            reported = False
            while not answered.wait(self.interval):
                if self._stop.is_set():
                    return
                self.lag = time.monotonic() - sent
                if self.lag > self.threshold and not reported:
                    self.stuck = reported = True
                    self.report(f"tether: event loop stuck for {self.lag:.1f} s (threshold {self.threshold:g} s), "
                                f"executing {self.culprit()}; /readyz answers 503 until it recovers")
            self.lag = time.monotonic() - sent
            if self.lag <= self.threshold:
                if self.stuck:
                    self.report(f"tether: event loop answering again ({self.lag * 1000:.0f} ms)")
                self.stuck = False
            self._stop.wait(self.interval)

    def culprit(self) -> str:
        """The run and call the loop thread is executing now, from its frames (innermost run wins)."""
        frame = sys._current_frames().get(self._loop_thread or -1)
        where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}" \
            if frame is not None else "(no frame)"
        run_id = seq = op = None
        while frame is not None and run_id is None:
            local = frame.f_locals
            owner = local.get("self")
            run_id = (local.get("run_id") if isinstance(local.get("run_id"), str) else None) \
                or _str_attr(owner, "run_id") or _str_attr(getattr(owner, "run", None), "run_id")
            if seq is None and isinstance(local.get("seq"), int):
                seq, op = local["seq"], local.get("op") or local.get("address")
            frame = frame.f_back
        call = f" call {seq} ({op})" if seq is not None else ""
        return f"run {run_id}{call} at {where}" if run_id else f"no run (at {where})"


class GraceOnSignal:
    """SIGINT and SIGTERM ask the process to stop (``ask``); from the first, a thread counts ``grace``
    seconds and then exits the process, whatever holds its event loop.

    The serving loop may be held by a run (operator code blocking it, a step that never ends), and a
    shutdown waits on that loop: a timer on the loop would never fire, a thread's does. ``tether serve``
    (HTTP and stdio) and ``tether worker`` stop this way. Installed from the main thread only, where
    Python runs signal handlers; elsewhere it does nothing.
    """

    def __init__(self, ask: Callable[[int], object], *, grace: float, report: Callable[[str], None]) -> None:
        self.ask, self.grace, self.report = ask, grace, report
        self.asked = False

    def handle(self, sig: int, frame: Any = None) -> None:
        if not self.asked:
            self.asked = True
            timer = threading.Timer(self.grace, self._exit)
            timer.daemon = True
            timer.start()
        self.ask(sig)

    def _exit(self) -> None:
        self.report(f"tether: still stopping {self.grace:g} s after the signal (shutdown_grace_seconds); exiting "
                    "now. Runs still running here keep their lease until it lapses, then another process takes "
                    "them over")
        os._exit(1)

    @contextlib.contextmanager
    def installed(self) -> Iterator[GraceOnSignal]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _str_attr(obj: Any, name: str) -> str | None:
    value = getattr(obj, name, None) if obj is not None else None
    return value if isinstance(value, str) else None


def _running(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class HostBudget:
    """The host time one attempt's built-ins and checks may take: the run's own time limit, spent as they run.

    Time inside tool calls does not count against ``limits.run_seconds`` (it
    is the program's time); host work done *for* the program does, so a
    program cannot make the host work past its limit by asking it to.
    """

    def __init__(self, seconds: float) -> None:
        self.limit = seconds
        self.spent = 0.0

    async def run(self, fn: Callable[..., T], *args: Any, what: str, inline: bool = False, **kwargs: Any) -> T:
        """``fn`` on the host-work threads, bounded by what is left of the budget.

        ``inline``: the caller knows this step is a lookup (a remembered verdict, memoized values), so it
        runs on the loop; a thread's round trip would cost more than the step (core_bench.py).
        """
        t = time.monotonic()
        try:
            if inline:
                return fn(*args, **kwargs)
            return await off_loop(fn, *args, seconds=self.limit - self.spent, what=what, **kwargs)
        finally:
            self.spent += time.monotonic() - t


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the host-work threads, for a caller that bounds the wait itself.

    The loader's spec parsing uses it: ``start_timeout`` cancels the wait and the source is reported failed.
    """
    return await asyncio.wrap_future(_POOL.submit(fn, *args, **kwargs))

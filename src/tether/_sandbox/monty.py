"""The only module that imports ``pydantic_monty``.

Monty's API has broken between releases (renamed limit keys, removed
constructor arguments, a changed ``external_lookup``), so everything tether
needs from it is expressed here in tether's own terms:

* :class:`SandboxPool` — one pool of worker processes for the whole process; ``reserve`` starts a
  worker's checkout (:class:`Reserved`) that an :class:`Execution` then enters.
* :class:`Execution` — one program's life in one checked-out worker: run it
  fresh (``feed_run``: one worker round trip per host call, the fastest way
  Monty offers), or continue it from a dump (``load_snapshot``), dump it while
  a host call is in flight, and stop it.
* :class:`GuestRaise` — what a host function raises to raise an exception
  *inside* the program.
* Monty's exceptions are mapped to :mod:`tether.errors` or to
  :class:`ProgramFailed` (an exception the program did not catch).
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextvars
import datetime as _dt
import keyword
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, cast

import pydantic_monty as _pm

from tether.errors import (
    CallLimit,
    MemoryLimit,
    ProgramSyntaxError,
    SandboxCrashed,
    TimeLimit,
    TypeCheckError,
)

MONTY_VERSION: str = f"pydantic-monty-{_pm.__version__}"
_SLEEPS = ("asyncio.sleep", "time.sleep")
# How long a stopping program may take to unwind before its worker is killed.
STOP_GRACE_SECONDS = 0.25
# Whether a call the program does not await at once (a gather's) reaches the host without suspending the
# worker (pydantic-monty's `stream_async_calls`). D-80 says why it is what it is.
STREAM_ASYNC_CALLS = True

# A host function gets the sandbox-side function name ("tools.ns.tool" or a
# built-in name), positional args and keyword args, and returns a value the
# sandbox receives, or raises GuestRaise.
HostFunction = Callable[[str, tuple[Any, ...], dict[str, Any]], Awaitable[Any]]
# Built-ins the program calls without awaiting (emit) get a plain function.
SyncHostFunction = Callable[[str, tuple[Any, ...], dict[str, Any]], Any]


class GuestRaise(Exception):
    """Raise ``exc_type(message)`` inside the program (a built-in exception type)."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message

    def to_exception(self) -> BaseException:
        cls = getattr(builtins, self.exc_type, None)
        # A bare BaseException is how a stopping run is wound down (see
        # Execution.stop): `except Exception` does not catch it, and unlike
        # SystemExit it does not escape asyncio's task machinery.
        if not (isinstance(cls, type) and (issubclass(cls, Exception) or cls is BaseException)):
            cls = RuntimeError
        try:
            return cls(self.message)
        except TypeError:  # UnicodeDecodeError and kin take five arguments, not a message
            return RuntimeError(f"{self.exc_type}: {self.message}")


@dataclass(frozen=True)
class Announced:
    """A host call a restored program (re-)announced: its id, name and arguments."""

    call_id: int
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Stopped(Exception):
    """The execution was stopped on purpose (a pause, a cancel or a limit)."""


class DumpNotAtCall(Exception):
    """A dump restored as a program stopped at a call is of a program that had already ended (an idle
    session): it cannot continue at a call, so the run is replayed from its journal instead (P-12, P-52)."""


@dataclass
class ProgramFailed(Exception):
    """The program raised an exception it did not catch."""

    exc_type: str
    message: str
    traceback: list[dict[str, Any]] = field(default_factory=list)
    line: int | None = None
    # The program's own ``raise`` raised it: never a limit or a sandbox refusal, whatever it says (P-14).
    raised: bool = False

    def __str__(self) -> str:
        return f"{self.exc_type}: {self.message}"


@dataclass(frozen=True)
class SandboxLimits:
    memory_bytes: int
    run_seconds: float
    host_calls: int
    recursion_depth: int = 1000


@dataclass(frozen=True)
class SandboxSpec:
    """Everything the program sees besides its own code."""

    namespaces: dict[str, tuple[str, ...]]  # namespace -> tool names
    builtins: tuple[str, ...]  # awaited host functions reachable by bare name
    sync_builtins: tuple[str, ...]  # plain host functions (e.g. emit)
    limits: SandboxLimits
    clock: _dt.datetime
    seed: int
    type_check: bool = True
    prelude_stubs: str | None = None  # type_check_stubs text
    tools_stubs: str | None = None  # stubs of the `tools` module
    namespace_stubs: dict[str, str] = field(default_factory=dict)
    # Identifies the catalog (and its stubs): the `tools` module is reused while it is the same.
    modules_key: Any = None
    # What the program reaches (addresses, namespaces reached dynamically), or None
    # for everything: the worker receives only that part of the `tools` module.
    reach: tuple[frozenset[str], frozenset[str]] | None = None


def _limits(limits: SandboxLimits) -> _pm.ResourceLimits:
    return {
        "max_memory": limits.memory_bytes,
        "max_feed_duration_secs": limits.run_seconds,
        "max_recursion_depth": limits.recursion_depth,
        # Imports, name lookups and future resolutions count as suspensions
        # too; tether enforces its own host-call limit at the effect
        # boundary, so Monty's must sit above it, never below.
        "max_suspensions": max(1000, limits.host_calls * 4 + 100),
    }


_CANDIDATE_MODULES = (
    "asyncio base64 binascii bisect collections copy csv dataclasses datetime decimal functools hashlib "
    "itertools json math os pathlib random re sys time tomllib typing unicodedata io string textwrap operator "
    "heapq statistics uuid urllib logging abc enum types struct array weakref contextlib warnings builtins"
).split()
_reserved: frozenset[str] | None = None


def reserved_module_names() -> frozenset[str]:
    """Names Monty keeps for its own modules: a tool namespace cannot use them (``tools.time`` is refused)."""
    global _reserved
    if _reserved is None:
        found = set()
        for name in _CANDIDATE_MODULES:
            try:
                _pm.ExternalModule({name: _pm.ExternalModule({})})
            except ValueError:
                found.add(name)
        _reserved = frozenset(found)
    return _reserved


def check_namespaces(tools: Iterable[Any]) -> None:
    """Refuse namespaces the sandbox keeps for its own modules (`tools.time` cannot exist)."""
    from tether.errors import NamespaceReserved

    reserved = reserved_module_names()
    for ns in sorted({t.namespace for t in tools} & reserved):
        raise NamespaceReserved(
            f"namespace {ns!r} is the name of a module the sandbox provides, so tools.{ns} cannot exist",
            next_action=f"Give the source another namespace, e.g. {ns + '_tools'!r} "
                        "(namespace = ... in [[sources]], or TETHER_NAMESPACE / @tool(namespace=...)).",
        )


_CURRENT: contextvars.ContextVar["Execution"] = contextvars.ContextVar("tether_execution")


def _tool_functions(ns: str, names: tuple[str, ...], cache: dict[str, Any]) -> dict[str, Any]:
    # Monty refuses keyword keys and hides "_" ones; such tools cannot be
    # called as attributes anyway, so they are left out of the module.
    out = {}
    for name in names:
        if name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_"):
            address = f"tools.{ns}.{name}"
            fn = cache.get(address)
            if fn is None:
                fn = cache[address] = _routed(address)
            out[name] = fn
    return out


def _routed(name: str) -> Callable[..., Awaitable[Any]]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await _CURRENT.get()._call(name, args, kwargs)

    return call


# --- leaving cleanly -------------------------------------------------------------
# Monty's async API is Rust futures on a tokio runtime. When one completes, a
# tokio thread calls loop.call_soon_threadsafe(), which schedules the result and
# then writes to the loop's wake-up socket with the GIL released. The loop can
# see the result, and the program can return from asyncio.run() and start
# interpreter shutdown, before that thread is back: it then asks for the GIL of
# a finalizing interpreter, CPython ends the thread with pthread_exit, the
# unwind crosses Rust frames that may not unwind, and the process aborts
# (SIGABRT, exit 134) after the program's work is done. tether counts the
# threads inside call_soon_threadsafe and waits for them (bounded) when a pool
# closes and at exit. docs/decisions.md D-23; reproduction in
# tests/api/test_python_api_exit.py.

_inside = 0
_inside_lock = threading.Lock()
# Far above the microseconds a wake-up write takes; a bound so exit never hangs.
_SETTLE_SECONDS = 2.0


def _track_completions(loop: asyncio.AbstractEventLoop) -> None:
    """Count foreign threads inside ``loop.call_soon_threadsafe`` (installed once per loop)."""
    if getattr(loop, "_tether_tracked", False):
        return
    original = loop.call_soon_threadsafe

    def call_soon_threadsafe(callback: Callable[..., object], *args: Any,
                             context: contextvars.Context | None = None) -> asyncio.Handle:
        global _inside
        with _inside_lock:
            _inside += 1
        try:
            return original(callback, *args, context=context)
        finally:
            with _inside_lock:
                _inside -= 1

    try:
        # Replacing a bound method on this loop instance; mypy sees a class attribute and a generic signature.
        loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign, assignment]
        loop._tether_tracked = True  # type: ignore[attr-defined]
    except AttributeError:  # a loop type without instance attributes (uvloop): nothing to count
        pass


async def _settle() -> None:
    """Wait until no tokio thread is still delivering a result into this process."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    # Polled: the counter is moved by threads inside call_soon_threadsafe itself, which could not
    # wake an Event without re-entering the very call being counted.
    while _inside and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    await asyncio.sleep(0)


@atexit.register
def _settle_at_exit() -> None:
    # A runtime never closed: its last deliveries may still be in flight.
    deadline = time.monotonic() + _SETTLE_SECONDS
    while _inside and time.monotonic() < deadline:
        time.sleep(0.001)


class SandboxPool:
    """A pool of Monty worker processes, shared by every run of the process."""

    def __init__(self, *, min_workers: int = 1, max_workers: int = 2, request_timeout: float = 120.0,
                 stream_async_calls: bool | None = None) -> None:
        self.max_workers = max_workers
        self.stream_async_calls = STREAM_ASYNC_CALLS if stream_async_calls is None else stream_async_calls
        self._pool = _pm.AsyncMonty(
            min_processes=min_workers,
            max_processes=max_workers,
            # Always set: `10**(10**8)` cannot be interrupted inside the VM,
            # only by killing the worker. Host calls do not count against it.
            request_timeout=request_timeout,
            stream_async_calls=self.stream_async_calls,
        )
        self._started = False
        self._lock = asyncio.Lock()
        self.busy = 0  # executions holding a worker now, or giving it back (metrics)
        self._returns: set[asyncio.Future[None]] = set()  # workers being given back (Execution.__aexit__)
        self._modules: tuple[Any, dict[Any, Any], dict[str, Any]] | None = None

    async def start(self) -> None:
        async with self._lock:
            if not self._started:
                _track_completions(asyncio.get_running_loop())
                await self._pool.__aenter__()
                self._started = True

    async def close(self) -> None:
        async with self._lock:
            if self._started:
                self._started = False
                await self.returned()
                await self._pool.__aexit__(None, None, None)
                await _settle()

    async def returned(self) -> None:
        """Wait until every worker being given back is back (an execute returns before its worker is)."""
        while self._returns:
            await asyncio.gather(*self._returns, return_exceptions=True)

    def returning(self, cm: Any) -> None:
        """Give a checked-out worker back to the pool in a task of its own (the caller does not wait)."""
        task = asyncio.ensure_future(self._give_back(cm))
        self._returns.add(task)
        task.add_done_callback(self._returns.discard)

    async def _give_back(self, cm: Any) -> None:
        try:
            # One loop turn first, so the caller has its answer before the return starts: Monty's __aexit__
            # holds the loop ~40 µs before its round trip, and this task's first step was queued ahead of the
            # caller's wake-up (the attempt's task ends in the step that queued it): 0.96x a 0-call execute,
            # paired in one process.
            await asyncio.sleep(0)
            await cm.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001 - the pool replaces a worker that died or was cut off mid-feed
            pass
        finally:
            self.busy -= 1

    def tools_module(self, spec: SandboxSpec) -> Any:
        """The `tools` module a run imports: only what its program reaches.

        Its functions find the execution they serve through a context
        variable (Monty runs host callbacks in the caller's context), so the
        modules are built once per catalog version and reach and shared by
        every run. The worker receives the module on `import tools`, in time
        proportional to its size: a run gets the namespaces and tools its
        program reaches (a namespace it reaches dynamically in full), not the
        whole catalog. A checked run's modules carry the stubs of that reach.
        """
        key = spec.modules_key
        if key is None or self._modules is None or self._modules[0] != key:
            self._modules = (key, {}, {})
        _, modules, functions = self._modules
        stubs = spec.namespace_stubs if spec.type_check else {}
        if spec.reach is None:
            wanted: dict[str, tuple[str, ...] | None] = {ns: None for ns in spec.namespaces}
        else:
            addresses, dynamic = spec.reach
            wanted = {ns: None for ns in dynamic if ns in spec.namespaces}
            picked: dict[str, set[str]] = {}
            for address in addresses:
                ns, _, name = address.partition(".")
                if ns in spec.namespaces and ns not in wanted:
                    picked.setdefault(ns, set()).add(name)
            wanted.update({ns: tuple(sorted(names)) for ns, names in picked.items()})
        whole_key = ("tools", tuple(wanted.items()) if spec.reach is not None else None, spec.tools_stubs
                     if spec.type_check else None)
        if not stubs:
            hit = modules.get(whole_key)
            if hit is not None:
                return hit
        children = {}
        for ns, names in wanted.items():
            stub = stubs.get(ns)
            child_key = (ns, names, stub)
            child = modules.get(child_key)
            if child is None:
                listed = names if names is not None else spec.namespaces[ns]
                child = _pm.ExternalModule(_tool_functions(ns, listed, functions), stubs=stub)
                modules[child_key] = child
            children[ns] = child
        tools = _pm.ExternalModule(children, stubs=spec.tools_stubs if spec.type_check else None)
        if not stubs:
            modules[whole_key] = tools
        if len(modules) > 2048:
            self._modules = (key, {}, functions)
        return tools

    def execution(
        self,
        spec: SandboxSpec,
        host: HostFunction,
        print_sink: Callable[[str, str], None],
        sync_host: SyncHostFunction | None = None,
        *,
        reserved: "Reserved | None" = None,
    ) -> "Execution":
        """One program's execution; ``reserved``: a checkout of ``spec`` already under way (:meth:`reserve`)."""
        return Execution(self, spec, host, print_sink, sync_host, reserved=reserved)

    async def reserve(self, spec: SandboxSpec) -> "Reserved":
        """Start checking out a worker for ``spec`` and return at once; the execution entered with it awaits it.

        The checkout is a round trip to a worker process (~0.1 ms) that moves only while the event loop is
        idle (its side needs the GIL); started before the attempt builds the rest of what it runs with, a
        short execute measured 3-6 % faster (paired in one process; core_bench's tether_0 row).
        Nothing is sent to a tool by a checkout. A reservation that is not entered must be released.
        """
        await self.start()
        # A worker on its way back is about to be idle: wait for it (~0.1 ms) rather than have the pool
        # start another process for a run that follows one that just answered.
        await self.returned()
        cm = self._pool.checkout(
            limits=_limits(spec.limits),
            type_check=spec.type_check,
            type_check_stubs=spec.prelude_stubs if spec.type_check else None,
            # Sleeps come to the host: a long one parks the run (a durable timer).
            os_policy={"datetime": spec.clock, "random_start": {"seed": spec.seed}, "sleep": "call_host"},
            external_modules={"tools": self.tools_module(spec)},
        )
        return Reserved(self, spec, cm, asyncio.ensure_future(cm.__aenter__()))


class Reserved:
    """A worker being checked out for one spec (:meth:`SandboxPool.reserve`): entered once, or released."""

    def __init__(self, pool: SandboxPool, spec: SandboxSpec, cm: Any, session: asyncio.Future[Any]) -> None:
        self.pool, self.spec, self.cm, self.session = pool, spec, cm, session
        self.taken = False

    async def enter(self) -> Any:
        """The checked-out session (once); SandboxCrashed if no worker could be started."""
        self.taken = True
        try:
            session = await self.session
        except _pm.MontyError as exc:
            raise SandboxCrashed(f"could not start a sandbox worker: {exc}") from None
        self.pool.busy += 1
        return session

    def release(self) -> None:
        """Give the worker back if the reservation was never entered (the attempt ended before its program)."""
        if self.taken:
            return
        self.taken = True

        def checked_out(done: asyncio.Future[Any]) -> None:
            if done.cancelled() or done.exception() is not None:
                return  # no worker was taken
            self.pool.busy += 1
            self.pool.returning(self.cm)

        self.session.add_done_callback(checked_out)


class Execution:
    """One program in one worker. Use as ``async with``; never reused after a limit trips."""

    def __init__(
        self,
        pool: SandboxPool,
        spec: SandboxSpec,
        host: HostFunction,
        print_sink: Callable[[str, str], None],
        sync_host: SyncHostFunction | None = None,
        *,
        reserved: Reserved | None = None,
    ) -> None:
        self._pool = pool
        self._reserved = reserved
        self._sync_host = sync_host
        self._spec = spec
        self._host = host
        self._print = print_sink
        self._session: Any = None
        self._cm: Any = None
        self._held: _pm.AsyncFutureSnapshot | None = None  # a restored snapshot not yet answered
        self._stop = asyncio.Event()
        self._stop_error: BaseException | None = None
        self._task: asyncio.Future[Any] | None = None

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> "Execution":
        reserved, self._reserved = self._reserved, None
        if reserved is None or reserved.spec is not self._spec:
            if reserved is not None:
                reserved.release()
            reserved = await self._pool.reserve(self._spec)
        self._cm = reserved.cm
        self._session = await reserved.enter()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            # The worker goes back to the pool after the answer, not before it: returning it is a round
            # trip to the worker (~0.1 ms) that nothing of this run waits on (its dump, if any, is taken).
            # The pool's close waits for the returns still under way.
            self._pool.returning(cm)


    # -- host functions -----------------------------------------------------

    async def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return await self._host(name, args, kwargs)
        except GuestRaise as exc:
            raise exc.to_exception() from None
        except Stopped:
            raise RuntimeError("the run is stopping") from None
        except Exception as exc:
            raise self._host_failure(exc) from None

    def _wrap(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._call(name, args, kwargs)

        return call

    def _host_failure(self, exc: Exception) -> BaseException:
        """A failure of tether itself (or its store) during a host call ends the run; the program never sees it."""
        from tether.errors import TetherError

        if isinstance(exc, TetherError):
            error: TetherError = exc
        else:
            error = TetherError(f"tether failed while serving a host call: {type(exc).__name__}: {exc}")
        self.stop(error)
        return RuntimeError("the run is stopping")

    def _wrap_sync(self, name: str) -> Callable[..., Any]:
        sync_host = self._sync_host

        def call(*args: Any, **kwargs: Any) -> Any:
            if sync_host is None:
                raise RuntimeError(f"{name} is not available")
            try:
                return sync_host(name, args, kwargs)
            except GuestRaise as exc:
                raise exc.to_exception() from None

        return call


    def _os(self, *, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], is_async: bool = False,
            **_: Any) -> Any:
        # Sync on purpose: NOT_HANDLED (Monty's own refusal of files, env...)
        # must be returned directly; only a sleep is answered by a coroutine.
        if name in _SLEEPS:
            return self._sleep(tuple(args), dict(kwargs))
        return _pm.NOT_HANDLED

    async def _sleep(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self._call("sleep", args, kwargs)

    def _lookup(self) -> dict[str, Any]:
        table: dict[str, Any] = {name: self._wrap(name) for name in self._spec.builtins}
        table.update({name: self._wrap_sync(name) for name in self._spec.sync_builtins})
        return table

    # -- driving ------------------------------------------------------------

    def stop(self, error: BaseException | None = None) -> None:
        """Stop the program; ``run``/``resume`` raise ``error`` (or Stopped).

        The host answers the program's pending calls with a bare BaseException
        (see the boundary), so it usually ends by itself and its worker goes back to the
        pool; a program that does not end within STOP_GRACE_SECONDS is cut off,
        which costs its worker process.
        """
        if self._stop_error is None:
            self._stop_error = error or Stopped()
        if not self._stop.is_set():
            self._stop.set()
            asyncio.get_running_loop().call_later(STOP_GRACE_SECONDS, self._cut_off)

    def _cut_off(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def finished(self) -> bool:
        """The program has returned or raised: a dump now is of the ended program, not at a call."""
        return self._task is None or self._task.done()

    async def dump(self) -> bytes:
        """Serialise the program's state; valid while a host call is in flight."""
        if self._held is not None:
            return self._held.dump()
        try:
            state: bytes = await self._session.dump()
            return state
        except _pm.MontyError as exc:
            if isinstance(exc, _pm.MontyRuntimeError) and type(exc.exception()).__name__ == "MemoryError":
                # Serialising needs room beside what the program holds (measured: a dump fails once the
                # state passes about a quarter of max_memory) and the worker is terminated when it runs out.
                raise MemoryLimit(
                    f"the program's state is too large to save within the {self._spec.limits.memory_bytes}-byte "
                    "memory limit: saving it needs room beside what the program holds",
                    next_action="Hold less in memory (drop or shrink large values before a write that asks, a "
                                "wait or a sleep), or raise [limits] memory_bytes.",
                ) from None
            raise SandboxCrashed(f"could not dump the sandbox: {exc}") from None

    async def run(self, code: str, session_state: bytes | None = None) -> Any:
        """Run ``code`` from the start (after loading a REPL session's globals); returns its last value."""
        # Monty captures the caller's context when the feed is created: the
        # `tools` functions find this execution through it.
        _CURRENT.set(self)
        if session_state is not None:
            try:
                await self._session.load_session(session_state)
            except _pm.MontyError as exc:
                raise SandboxCrashed(f"could not load the session state: {exc}") from None
        return await self._until_stopped(
            self._session.feed_run(code, external_lookup=self._lookup(), print_callback=self._print, os=self._os)
        )

    async def resume(self, dump: bytes, answer: Callable[[list[int], list["Announced"]], Awaitable[dict[int, Any]]]) -> Any:
        """Continue from ``dump``; ``answer`` settles the calls the restored program waits on.

        A dump taken while host calls are in flight restores as a future
        snapshot waiting on some call ids, sometimes after re-announcing
        calls the worker had issued but not yet handed over. ``answer`` gets
        the ids waited on and the re-announced calls (with their names and
        arguments) and returns, per id, a value or a :class:`GuestRaise`.
        """

        _CURRENT.set(self)

        async def drive() -> Any:
            try:
                snap = await self._session.load_snapshot(dump, external_lookup=self._lookup(), print_callback=self._print,
                                                         os=self._os)
            except _pm.MontyError as exc:
                raise SandboxCrashed(f"could not load the snapshot: {exc}") from None
            except RuntimeError as exc:
                # A task the program never awaited parked the run as the program returned: the worker had
                # ended the program by the time its state was dumped (pydantic-monty 1.7.0's wording).
                if "idle session" in str(exc):
                    raise DumpNotAtCall(str(exc)) from None
                raise
            announced: list[Announced] = []
            while not isinstance(snap, (_pm.AsyncFutureSnapshot, _pm.MontyComplete)):
                if isinstance(snap, _pm.AsyncFunctionSnapshot) and (
                        not snap.is_os_function or snap.function_name in _SLEEPS):
                    name = "sleep" if snap.is_os_function else snap.function_name
                    announced.append(Announced(snap.call_id, name, tuple(snap.args), dict(snap.kwargs)))
                    snap = await snap.resume({"future": ...})
                else:
                    snap = await snap.resume_auto()
            if isinstance(snap, _pm.AsyncFutureSnapshot):
                self._held = snap
                results = await answer(list(snap.pending_call_ids), announced)
                self._held = None
                snap = await snap.resume({cid: _settled(v) for cid, v in results.items()})
            while not isinstance(snap, _pm.MontyComplete):
                snap = await snap.resume_auto()
            return snap.output

        return await self._until_stopped(drive())

    async def _until_stopped(self, work: Awaitable[Any]) -> Any:
        # The feed runs in its own task so stop() can cancel it: one task,
        # no watcher, on the hot path of every run.
        task = self._task = asyncio.ensure_future(work)
        try:
            value = await asyncio.shield(task)
            if self._stop_error is not None:
                raise self._stop_error
            return value
        except asyncio.CancelledError:
            if self._stop_error is not None and not _cancelling_us():
                await asyncio.gather(task, return_exceptions=True)
                raise self._stop_error from None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        except Exception as exc:
            # Stopped on purpose: whatever the feed ended with (a worker a failed dump terminated ends it
            # with a RuntimeError, not a MontyError), the reason is the stop's.
            if self._stop_error is not None:
                raise self._stop_error from None
            if isinstance(exc, _pm.MontyError):
                raise map_monty_error(exc, self._spec.limits) from None
            if isinstance(exc, RuntimeError) and _LEFT_BEHIND_AWAITED in str(exc):
                # The worker raises this to the host, not into the program: the program awaited a task or
                # call a REPL session's earlier execute left behind, which that execute's end settled
                # (P-50). The program's doing, so its error and not tether's (P-52).
                raise ProgramFailed("RuntimeError", LEFT_BEHIND_MESSAGE) from None
            raise
        finally:
            self._task = None


# What the worker says when the program awaits a call it no longer has (pydantic-monty 1.7.0).
_LEFT_BEHIND_AWAITED = "No pending async tasks but ResolveFutures requested"
LEFT_BEHIND_MESSAGE = (
    "the program awaited a task or a call an earlier execute of this session left behind; that execute's end "
    "settled what it had issued (a write it never awaited was sent or declined then), so it cannot be awaited "
    "now, and nothing was sent for it"
)


def _cancelling_us() -> bool:
    """Whether the caller's own task is being cancelled (not just the feed we shield)."""
    current = asyncio.current_task()
    return bool(current is not None and current.cancelling())


def _settled(value: Any) -> _pm.ExternalSettledResult:
    if isinstance(value, GuestRaise):
        # Any built-in exception's name; Monty checks it against its own list when it resumes.
        return {"exc_type": cast("_pm.ExcType", value.exc_type), "message": value.message}
    return {"return_value": value}


def map_monty_error(exc: BaseException, limits: SandboxLimits) -> BaseException:
    """Translate a Monty error into tether's terms (a tether error or ProgramFailed)."""
    if isinstance(exc, _pm.MontySyntaxError):
        frames = _frames(exc)
        where = frames[-1] if frames else {}
        line, col = where.get("line"), where.get("column")
        loc = f" at line {line}, column {col}" if line else ""
        return ProgramSyntaxError(f"syntax error{loc}: {exc.display('msg')}", details={"line": line, "column": col})
    if isinstance(exc, _pm.MontyTypingError):
        text = exc.display()
        if "error[invalid-syntax]" in text:
            # The checker parses first: a syntax error is a syntax error, not a typing one.
            line, col, msg = _first_diagnostic(text)
            loc = f" at line {line}, column {col}" if line else ""
            return ProgramSyntaxError(f"syntax error{loc}: {msg}", details={"line": line, "column": col})
        return TypeCheckError(
            "the program was rejected by the type checker before running",
            details={"diagnostics": exc.display()},
        )
    if isinstance(exc, _pm.MontyCrashedError):
        if exc.timed_out:
            return TimeLimit(
                f"the program ran past the {limits.run_seconds:g} s time limit in one uninterruptible step "
                "and its worker was stopped",
            )
        return SandboxCrashed(f"the sandbox worker died: {exc}")
    if isinstance(exc, _pm.MontyRuntimeError):
        inner = exc.exception()
        exc_type = type(inner).__name__
        message = str(inner)
        frames = _frames(exc)
        # The program's own exception, message and all, is program_error, never a limit (P-14).
        raised = _raised_by_program(exc)
        if not raised and exc_type == "MemoryError":
            # Whatever the allocation that failed, it failed against the sandbox's heap limit.
            return MemoryLimit(
                f"the program used more than {limits.memory_bytes} bytes of memory"
            )
        if not raised and exc_type == "RuntimeError" and "suspension limit" in message:
            # emit() and imports suspend the VM too; Monty stops the program
            # at its ceiling, uncatchable: the run made too many host calls.
            return CallLimit(
                f"the program suspended more than {_limits(limits)['max_suspensions']} times (host calls, emit() "
                "and imports each count); the sandbox stopped it",
                next_action="Batch the work: fewer, larger tool calls and emit()s per run.",
            )
        if not raised and exc_type == "TimeoutError" and "time limit exceeded" in message:
            return TimeLimit(
                f"the program ran longer than the {limits.run_seconds:g} s time limit "
                "(time inside tool calls does not count)",
            )
        return ProgramFailed(exc_type, message, frames, frames[-1]["line"] if frames else None, raised=raised)
    if isinstance(exc, _pm.MontyError):
        return SandboxCrashed(f"sandbox error: {exc}")
    return exc


def _first_diagnostic(text: str) -> tuple[int | None, int | None, str]:
    """(line, column, message) of the first diagnostic in the checker's rendered text."""

    head = re.search(r"error\[invalid-syntax\]: (.*)", text) or re.search(r"error\[[\w-]+\]: (.*)", text)
    if head is not None:
        text = text[head.start():]
    where = re.search(r"--> [^:\n]+:(\d+):(\d+)", text)
    msg = head.group(1).strip() if head else "invalid syntax"
    return (int(where.group(1)), int(where.group(2)), msg) if where else (None, None, msg)


def _is_program_frame(frame: Any) -> bool:
    # The REPL names the program's frames <python-input-N>; the host's are nobody's business.
    return bool(frame.filename.startswith("<python-input") or frame.filename == "main.py")


def _raised_by_program(exc: Any) -> bool:
    """Whether a ``raise`` statement of the program raised ``exc`` (rather than the VM, at a limit).

    The VM marks the expression that hit a limit (``'x' * 10**9``, even inside a ``raise``), or no frame at
    all; a ``raise`` marks the raised expression right after its keyword (pydantic-monty 1.4), or in
    ``raise X from Y`` the cause right after ``from`` (1.6). Limits cannot be caught, so a limit's exception
    is never re-raised by the program either. Left ambiguous: a limit hit by a cause that is itself the
    whole offending expression (``raise E from 'x' * 10**9``) reads as raised.
    """
    try:
        frames = exc.traceback()
    except Exception:
        return False
    if not frames or not _is_program_frame(frames[-1]):
        return False
    source, column = frames[-1].source_line, frames[-1].column
    if not isinstance(source, str) or not isinstance(column, int) or column < 1:
        return False
    before = source[:column - 1].rstrip()
    return re.search(r"(?:^|[^\w.])raise$", before) is not None or re.search(
        r"(?:^|[^\w.])raise\b.*[^\w.]from$", before) is not None


def _frames(exc: Any) -> list[dict[str, Any]]:
    try:
        frames = exc.traceback()
    except Exception:
        return []
    out = []
    for frame in frames:
        if not _is_program_frame(frame):
            continue
        out.append({"line": frame.line, "column": frame.column, "function": frame.function_name,
                    "source": frame.source_line})
    return cap_frames(out)


# A recursion error carries a frame per level (1,000 of them, 160 KB): the
# first frames say where it started, the last where it broke.
KEPT_FRAMES = 5


def cap_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first and last KEPT_FRAMES frames, with one frame in between counting the rest."""
    if len(frames) <= 2 * KEPT_FRAMES + 1:
        return frames
    omitted = len(frames) - 2 * KEPT_FRAMES
    marker = {"line": None, "column": None, "function": f"... {omitted} frames omitted ...", "source": None,
              "omitted": omitted}
    return frames[:KEPT_FRAMES] + [marker] + frames[-KEPT_FRAMES:]


def is_monty_error(exc: BaseException) -> bool:
    return isinstance(exc, _pm.MontyError)


async def probe_names(pool: SandboxPool) -> tuple[list[str], list[str]]:
    """(built-in names, importable modules) this sandbox accepts at run time.

    The candidates are CPython's own builtins and standard-library modules;
    each is tried inside the sandbox. Tests check every one passes the
    pre-run check, so a Monty release that adds a name cannot make the check
    refuse programs that would run.
    """
    import sys

    names = [n for n in dir(builtins) if not n.startswith("_")]
    modules = sorted(m for m in sys.stdlib_module_names if m.isidentifier() and not m.startswith("_"))
    probe_names_code = "out = []\n" + "".join(
        f"try:\n    {n}\n    out.append({n!r})\nexcept NameError:\n    pass\n" for n in names
        if not keyword.iskeyword(n)) + "out"
    probe_modules_code = "out = []\n" + "".join(
        f"try:\n    import {m}\n    out.append({m!r})\nexcept Exception:\n    pass\n" for m in modules) + "out"
    await pool.start()
    found = []
    for code in (probe_names_code, probe_modules_code):
        async with pool._pool.checkout(limits=_limits(SandboxLimits(64 * 1024 * 1024, 30.0, 0))) as session:
            found.append(list(await session.feed_run(code)))
    return found[0], found[1]

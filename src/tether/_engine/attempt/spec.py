"""What a sandbox is built with for one attempt: the pre-run check's reach, stubs, limits, the pinned clock.

An attempt enters this module once, through :func:`prepare`: the pre-run check and the spec in one
step, with the key the type checker's verdict is remembered under (the attempt remembers it once
the program ran). ``build_spec`` and ``precheck`` take anything with ``catalog``, ``verdicts`` and
``type_check`` (the Engine an attempt runs with, or a test's stand-in).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tether._engine.calls.boundary import BUILTIN_OPS
from tether._engine.rules.limits import Limits
from tether._sandbox.monty import SandboxLimits, SandboxSpec
from tether._store.base import RunRecord
from tether._tools.precheck import EVERYTHING, Reach, check_program, remembered
from tether._tools.stubs import stubs_for
from tether.errors import HostWorkTimeout, SourceUnavailable, TetherError, UnknownTool

if TYPE_CHECKING:
    from tether._hostwork import HostBudget
    from tether._tools.catalog import Catalog

# Awaited built-ins the program reaches by bare name; emit is a plain call.
BUILTINS = BUILTIN_OPS + ("wait_for", "wait_for_signal", "yield_control")
SYNC_BUILTINS = ("emit",)


class SpecSource(Protocol):
    """What building a sandbox spec reads: the catalog, remembered checker verdicts, the default check."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def verdicts(self) -> dict[str, bool]: ...

    @property
    def type_check(self) -> bool: ...


@dataclass(frozen=True)
class Prepared:
    """What an attempt's sandbox is built with, or why its program is refused before it starts."""

    spec: SandboxSpec | None  # None only when the work timed out (``refused`` says so)
    refused: TetherError | None  # the pre-run check's finding, or a timeout: raised before anything runs
    # Set when the sandbox type-checks the program: the key the checker's verdict is remembered under.
    verdict_key: str | None = None


async def prepare(src: SpecSource, run: RunRecord, limits: Limits, budget: HostBudget, *,
                  continuing: bool) -> Prepared:
    """The pre-run check of a fresh run, then its sandbox spec, as one step of the host budget.

    On the host-work threads unless both are lookups (a remembered check, no stubs to build): then a
    thread's round trip would cost more than the work (core_bench.py).
    """
    slow = []
    if not continuing and not remembered(run.program, src.catalog):
        slow.append("the pre-run check")
    if builds_stubs(src, run, continuing=continuing):
        slow.append("building the program's type stubs")
    try:
        return await budget.run(_prepare, src, run, limits, continuing=continuing, what=" and ".join(slow),
                                inline=not slow)
    except HostWorkTimeout as exc:
        return Prepared(None, exc)


def _prepare(src: SpecSource, run: RunRecord, limits: Limits, *, continuing: bool) -> Prepared:
    reach, refused = None, None
    if not continuing:
        try:
            reach = precheck(src, run)
        except TetherError as exc:
            refused = exc  # reported before the sandbox starts: nothing runs
    spec, key = _build(src, run, limits, continuing=continuing, reach=reach)
    return Prepared(spec, refused, key)


def run_check_mode(src: SpecSource, run: RunRecord) -> str:
    """The check mode recorded on the run (older runs recorded a type_check flag)."""
    mode: str | None = run.meta.get("check")
    if mode is None:
        return "full" if run.meta.get("type_check", src.type_check) else "off"
    return mode


def precheck(src: SpecSource, run: RunRecord) -> Reach:
    """The pre-run check of a fresh run (tools.precheck); raises what it finds, before any call.

    With the check off nothing is raised, but what the program reaches still
    decides how much of the `tools` module its sandbox gets.
    """
    if run_check_mode(src, run) == "off":
        try:
            return check_program(run.program, src.catalog)
        except TetherError:
            return EVERYTHING
    try:
        return check_program(run.program, src.catalog)
    except UnknownTool as exc:
        raise _unavailable(exc, getattr(src, "source_failures", None)) or exc from None


def _unavailable(exc: UnknownTool, failures: Any) -> SourceUnavailable | None:
    """An unknown namespace that is a configured source which failed to load: say that, and why."""
    address = str(exc.details.get("address") or "")
    namespace = address.partition(".")[0]
    failed = failures() if callable(failures) else {}
    reason = failed.get(namespace) if namespace else None
    if reason is None:
        return None
    where = exc.message.split("no namespace", 1)[0] if "no namespace" in exc.message else ""
    return SourceUnavailable(
        f"{where}the source {namespace!r} is configured but failed to load: {reason}; nothing was run",
        next_action=f"Fix what the error names (then `tether sources list` shows {namespace!r} ok), or write the "
                    "program without it.",
        details={**exc.details, "source": namespace, "reason": reason,
                 "suggestions": ["tether sources list", f"tether run --no-check (calls to {namespace} still fail)"]},
    )


def _namespaces(src: SpecSource) -> dict[str, tuple[str, ...]]:
    def group() -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for tool in src.catalog.tools():
            out.setdefault(tool.namespace, []).append(tool.name)
        return {ns: tuple(names) for ns, names in out.items()}

    memo = getattr(src.catalog, "memo", None)
    return memo("sandbox-namespaces", group) if memo else group()


def builds_stubs(src: SpecSource, run: RunRecord, *, continuing: bool) -> bool:
    """Whether :func:`build_spec` builds type stubs (work that grows with the catalog) for this attempt.

    Without them it reads memoized values and parses two fields: no reason to leave the event loop.
    """
    return run_check_mode(src, run) == "full" and not continuing


def build_spec(src: SpecSource, run: RunRecord, limits: Limits, *, continuing: bool = False,
               reach: Reach | None = None) -> SandboxSpec:
    """The sandbox spec alone (what :func:`prepare` builds after the check)."""
    return _build(src, run, limits, continuing=continuing, reach=reach)[0]


def _build(src: SpecSource, run: RunRecord, limits: Limits, *, continuing: bool,
           reach: Reach | None) -> tuple[SandboxSpec, str | None]:
    # A program that already passed the check at its first attempt is not
    # checked again when it continues (restore or replay).
    type_check = builds_stubs(src, run, continuing=continuing)
    stubs, key = None, None
    if continuing or run.session or reach is None:
        # A continuing program must find the module it started with, and a
        # session's globals may hold `tools` from an earlier execute.
        reach = EVERYTHING
    if type_check:
        stubs = stubs_for(src.catalog, reach.addresses, reach.namespaces, reach.everything)
        key = _verdict_key(run.program, stubs)
        if src.verdicts.get(key) is True:
            # The same program against the same stubs passed before: the
            # checker would say the same again.
            type_check, key = False, None
    return SandboxSpec(
        namespaces=_namespaces(src),
        builtins=BUILTINS,
        sync_builtins=SYNC_BUILTINS,
        limits=SandboxLimits(
            memory_bytes=limits.memory_bytes,
            run_seconds=limits.run_seconds,
            host_calls=limits.host_calls,
            recursion_depth=limits.recursion_depth,
        ),
        clock=_dt.datetime.fromisoformat(run.environment["clock"]),
        seed=int(run.environment["seed"]),
        type_check=type_check,
        prelude_stubs=getattr(stubs, "prelude", None),
        tools_stubs=getattr(stubs, "tools_module", None),
        namespace_stubs=dict(getattr(stubs, "namespace_modules", {}) or {}),
        modules_key=(id(src.catalog), getattr(src.catalog, "version", None)),
        reach=None if reach.everything else (reach.addresses, reach.namespaces),
    ), key


def _verdict_key(code: str, stubs: Any) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for part in (code, stubs.prelude, stubs.tools_module, *sorted(stubs.namespace_modules.items())):
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()

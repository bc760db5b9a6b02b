"""Sources as runs record them, and the set of sources a process has loaded.

A run records the *definitions* of the sources it started with (P-30), not the
path of a config file: what another directory, machine, worker or replica
needs to load the same tools. Secrets stay references: ``${VAR}`` in ``env``
and ``headers`` and ``token_env``/``value_env`` in ``auth`` are recorded as
written and resolved where the run continues; a value written literally in
the config is recorded only as a digest, and is taken from a local config
whose source has the same namespace and the same value.

:class:`SourceSet` loads definitions concurrently, each bounded by its
``start_timeout``. An MCP server's tool listing comes from the store's cache
when there is one, and the server itself starts only when a program first
calls one of its tools (or a command needs it live). A cached listing says
which tools are reads, so it is signed under the store's secret like run
state (P-35): a row that does not verify is not used, and the server is
listed live before anything is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Mapping, Protocol

from tether._engine.approvals.capabilities import Keyring, keyring_for, mac_hex, same, secret_id
from tether._sources.base import ENV_REF, Source
from tether._sources.kinds import DEFAULT_START_TIMEOUT, SourceContext, kind_of
from tether._sources.undos import with_undos
from tether._tools.model import Tool
from tether.errors import ConfigError, NamespaceTaken, SourceUnavailable, TetherError, ToolsUnavailable

if TYPE_CHECKING:
    from tether._engine.events import EventBus
    from tether._sources.mcp import MCPSource
    from tether._store.base import Store
    from tether._tools.catalog import Catalog

__all__ = ["LoadedSource", "SourceSet", "definition_key", "record_definition"]

_LITERAL = "<literal sha256:"
# A failed source is not retried more often than this by a long-lived process
# (a worker polls every 0.2 s; a hung server would otherwise cost a start_timeout each time).
RETRY_SECONDS = 30.0
# A long-lived process (serve, worker) re-lists a server whose cached listing is
# older than this, in the background: servers change their tools rarely, and a
# call to a tool that is gone fails upstream without harm.
REFRESH_AFTER_SECONDS = 3600.0
# What the listing cache's MAC is made for: a listing's MAC can never pass for another purpose's.
LISTING_PURPOSE = "tether/source-listing/v1"


# --- definitions ----------------------------------------------------------------


def _digest(value: str, secret: bytes) -> str:
    # Keyed by the store's secret: a short literal (a PIN, a weak token) cannot
    # be recovered from the store by hashing guesses.
    return f"{_LITERAL}{mac_hex(secret, value.encode())[:32]}>"


def record_definition(source: Any, secret: bytes = b"") -> dict[str, Any]:
    """A config source as a run records it: JSON, secrets as references or keyed digests."""
    data = source.model_dump(mode="json", exclude_none=True) if hasattr(source, "model_dump") else dict(source)
    for table in ("env", "headers"):
        if data.get(table):
            data[table] = {k: v if ENV_REF.search(v) else _digest(v, secret) for k, v in data[table].items()}
    return data


def definition_key(definition: dict[str, Any]) -> str:
    """Names one definition: equal definitions load the same tools (the listing cache's key)."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _label(definition: dict[str, Any]) -> str:
    return str(definition.get("namespace") or definition.get("module") or "?")


def _fill_literals(definition: dict[str, Any], local: Iterable[Any], secrets: Iterable[bytes]) -> dict[str, Any]:
    """Put back literal values a run recorded as digests, from a matching local source.

    A run recorded before the secret was rotated has digests under an older secret: any held one matches.
    """
    secrets = list(secrets)
    out = dict(definition)
    for table in ("env", "headers"):
        values = dict(out.get(table) or {})
        for key, value in values.items():
            if not (isinstance(value, str) and value.startswith(_LITERAL)):
                continue
            for source in local:
                if getattr(source, "namespace", None) != definition.get("namespace"):
                    continue
                candidate = (getattr(source, table, None) or {}).get(key)
                if isinstance(candidate, str) and any(same(_digest(candidate, s), value)
                                                      for s in secrets):
                    values[key] = candidate
                    break
            else:
                raise ConfigError(
                    f"{table[:-1] if table == 'headers' else table} {key!r} was written literally in the config the "
                    "run started with; literal values are not recorded with a run",
                    next_action=f"Write it as ${{VAR}} in [[sources]] and set VAR, or continue the run where a "
                                f"config with the same source {definition.get('namespace')!r} is in force.",
                )
        if values:
            out[table] = values
    return out


def _check_resolvable(definition: dict[str, Any]) -> None:
    """What can be told without starting anything: variables set, command found, file there."""
    for table in ("env", "headers"):
        for key, value in (definition.get(table) or {}).items():
            for var in ENV_REF.findall(value):
                if var not in os.environ:
                    raise ConfigError(f"{table} {key!r} references ${{{var}}}, which is not set",
                                      next_action=f"Set the environment variable {var}.")
    auth = definition.get("auth") or {}
    var = auth.get("token_env") or auth.get("value_env")
    if var and not os.environ.get(var):
        raise ConfigError(f"auth needs the environment variable {var}, which is not set",
                          next_action=f"Set the environment variable {var}.")
    command = definition.get("command")
    if command:
        cwd = definition.get("cwd")
        exe = command[0]
        found = (shutil.which(exe) if os.sep not in exe
                 else exe if os.access(os.path.join(cwd or "", exe), os.X_OK) else None)
        if found is None:
            raise ConfigError(f"command {exe!r} is not found or not executable",
                              next_action=f"Install {exe!r} or fix 'command' in [[sources]].")
        if cwd is not None and not os.path.isdir(cwd):
            raise ConfigError(f"cwd {cwd!r} is not a directory")
    spec = definition.get("spec")
    if spec and not str(spec).startswith(("http://", "https://")) and not os.path.isfile(spec):
        raise ConfigError(f"the OpenAPI description {spec} does not exist")


class LiveAttempts(Protocol):
    """What the sources read of the attempts running in this process (tether._engine.engine.Attempts):
    an upstream's question or progress goes to the run with a call to it on the wire."""

    @property
    def live(self) -> Mapping[str, Any]: ...

    def boundaries_calling(self, address: str) -> list[Any]: ...


def forward_progress(store: Store, attempts: LiveAttempts, events: EventBus) -> Callable[[Any], None]:
    """An MCP source's progress reports, delivered to the run whose call they are about.

    A cell gets a ``progress`` event; a client watching the run (``on_progress``,
    MCP progress notifications) gets a count that keeps rising: the calls done
    plus a fraction of this one.
    """

    def forward(report: Any) -> None:
        address = f"{report.namespace}.{report.tool}"
        for boundary in attempts.boundaries_calling(address):
            data = {"address": address, "progress": report.progress, "total": report.total,
                    "message": report.message}
            run = store.get_run(boundary.run_id)  # a live boundary's run exists; None only if deleted under it
            if run is not None and (run.meta or {}).get("cell"):
                events.emit(boundary.run_id, "progress", data)
            if boundary.on_progress is not None:
                p = max(report.progress, 0.0)
                fraction = p / report.total if report.total else p / (p + 1.0)
                text = f"{address}: {report.message}" if report.message else address
                boundary.on_progress(len(boundary.state.stats) + min(fraction, 0.99), text)

    return forward


# --- one loaded source ------------------------------------------------------------


@dataclass
class LoadedSource:
    """One source in a process: its definition, its tools or why it has none."""

    definition: dict[str, Any]
    key: str
    origin: str | None = None  # "<config file>: sources[i]", for messages
    namespace: str | None = None
    ok: bool = False
    error: str | None = None
    tools: list[Any] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)
    impl: Source | None = None  # the started source, if any
    failed_at: float = 0.0
    cached: bool = False  # tools came from the listing cache; the server is not started yet
    exc: BaseException | None = None  # what failed, for callers that must raise it

    @property
    def type(self) -> str:
        return str(self.definition.get("type"))

    @property
    def name(self) -> str:
        return self.namespace or _label(self.definition)

    def status(self) -> dict[str, Any]:
        return {"source": self.name, "type": self.type, "ok": self.ok, "tools": len(self.tools),
                "error": self.error, "problems": self.problems, "origin": self.origin,
                "started": self.impl is not None and self.impl.started}


# --- the set ------------------------------------------------------------------------


class SourceSet:
    """The sources loaded in one process, keyed by definition.

    ``catalog`` receives their tools; an MCP server's mid-call question goes to
    the run with a call to it on the wire (``attempts``, ``events``; see
    tether._engine.attempt.questions); ``store`` keeps MCP listings; ``log_dir`` gets
    one ``<namespace>.log`` per stdio server for its stderr.
    """

    def __init__(self, catalog: Catalog, *, attempts: LiveAttempts, events: EventBus, store: Store | None = None,
                 log_dir: Path | None = None, local: Iterable[Any] = (), default_call_timeout: float | None = None,
                 progress: Callable[[Any], None] | None = None) -> None:
        self.catalog = catalog
        self.attempts = attempts
        self.events = events
        self.store = store
        keyring = keyring_for(store) if store is not None else Keyring(b"")
        self.secret: bytes = keyring.current
        self._verify_with = list(keyring.keys)
        self.log_dir = log_dir
        self.local = list(local)  # this process's own config sources (literal values live there)
        self.default_call_timeout = default_call_timeout
        self.progress = progress
        self.loaded: dict[str, LoadedSource] = {}
        self.own: list[str] = []  # keys of the sources this process was configured with, in order
        self._lock = asyncio.Lock()
        self._logs: list[Any] = []
        self._closing: list[asyncio.Future[None]] = []
        self._refreshing: list[asyncio.Task[None]] = []

    # -- loading

    async def add(self, definitions: list[dict[str, Any]], origins: list[str | None] | None = None,
                  *, own: bool = True) -> list[LoadedSource]:
        """Load definitions concurrently; a failure is recorded on its entry, never raised."""
        origins = origins or [None] * len(definitions)
        entries = await asyncio.gather(*(self._ensure(d, o) for d, o in zip(definitions, origins)))
        if own:
            self.own += [e.key for e in entries if e.key not in self.own]
        return list(entries)

    async def _ensure(self, definition: dict[str, Any], origin: str | None) -> LoadedSource:
        key = definition_key(definition)
        entry = self.loaded.get(key)
        if entry is not None and (entry.ok or time.monotonic() - entry.failed_at < RETRY_SECONDS):
            return entry
        entry = LoadedSource(definition, key, origin or (entry.origin if entry else None),
                             namespace=definition.get("namespace"))
        self.loaded[key] = entry
        try:
            await self._load(entry)
            entry.ok, entry.error = True, None
        except asyncio.TimeoutError:
            timeout = definition.get("start_timeout", DEFAULT_START_TIMEOUT)
            self._fail(entry, f"did not start within {timeout:g} s (start_timeout)")
        except TetherError as exc:
            self._fail(entry, str(exc))  # with its [code]: namespace_reserved, config_invalid...
            entry.exc = exc
        except Exception as exc:  # a source that cannot load must not stop the others
            self._fail(entry, f"{type(exc).__name__}: {exc}")
            entry.exc = exc
        return entry

    def _fail(self, entry: LoadedSource, reason: str) -> None:
        entry.ok, entry.error, entry.failed_at = False, reason, time.monotonic()
        entry.tools = []

    async def _load(self, entry: LoadedSource) -> None:
        definition = _fill_literals(entry.definition, self.local, self._verify_with)
        _check_resolvable(definition)
        timeout = float(definition.get("start_timeout", DEFAULT_START_TIMEOUT))
        source = self._source(entry, definition, timeout)
        try:
            await asyncio.wait_for(source.start(), timeout)
        except BaseException:
            # A server that ignores its stdin closing takes the SDK a few seconds to
            # stop: let that overlap the program, and wait for it at close().
            self._closing.append(asyncio.ensure_future(source.close()))
            raise
        entry.impl = source
        entry.problems = list(source.problems)
        found = source.tools()
        if found:
            entry.namespace = found[0].namespace
        if kind_of(entry.type).caches_listing and not entry.cached:
            self._remember_listing(entry.key, source)
        self._register(entry, found, source.summary)

    def _source(self, entry: LoadedSource, definition: dict[str, Any], timeout: float) -> Source:
        """The source a definition names, not started yet."""
        if kind_of(definition.get("type")).caches_listing:
            # The listing from the cache when there is one: the server starts at the first call.
            cached = self._signed_listing(entry.key)
            if cached is not None:
                entry.cached = True
                return _LazyMCP(self, entry, definition, timeout, listing=cached[0], cached_at=cached[1])
        return self._build(definition, timeout)

    def _build(self, definition: dict[str, Any], timeout: float) -> Any:
        """The source itself, built by its kind's builder from what this process holds."""
        kind = kind_of(definition.get("type"))
        return kind.build(definition, SourceContext(
            timeout=timeout, errlog=self._errlog, default_call_timeout=self.default_call_timeout,
            catalogs=_SignedCatalogs(self.store, self._verify_with) if self.store is not None else None,
            ask=self._ask if kind.asks_questions else None, progress=self.progress))

    def _ask(self, namespace: str) -> Callable[[Any], Awaitable[Any]]:
        """The handler an upstream's mid-call question to ``namespace`` goes to (tether._engine.attempt.questions)."""
        from tether._engine.attempt.questions import elicitation_handler

        return elicitation_handler(namespace, self.attempts.live, self.events)

    def _errlog(self, namespace: str) -> Any:
        """``<log_dir>/<namespace>.log`` for a stdio server's stderr, closed with the set; None without a log_dir."""
        if self.log_dir is None:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{namespace}.log", "a", encoding="utf-8")  # noqa: SIM115 - closed at close()
        self._logs.append(log)
        return log

    def _register(self, entry: LoadedSource, found: list[Tool], summary: str | None = None) -> None:
        from tether._sandbox.monty import check_namespaces

        check_namespaces(found)
        found = with_undos(found, entry.definition)  # P-46: the undos its definition declares or pairs
        for ns in sorted({t.namespace for t in found}):
            if any(t.namespace == ns for t in self.catalog.tools()):
                raise NamespaceTaken(f"namespace {ns!r} is already taken by another source in this process")
        self.catalog.add_many(found)
        entry.tools = list(found)
        if summary:
            # The source's one line (API title, server name, module docstring) for
            # sources() and the prompt; the same for each namespace it filled.
            for ns in sorted({t.namespace for t in found}):
                self.catalog.set_namespace_summary(ns, summary)

    # -- a kind that caches its listing (MCP): listing from the cache, server on first call

    def _remember_listing(self, key: str, source: Any) -> None:
        if self.store is None:
            return
        data: dict[str, Any] = {"tools": source.listing, "server": source.server_info}
        data["mac"] = {"sid": secret_id(self.secret),
                       "mac": Keyring.mac(self.secret, LISTING_PURPOSE, key, data["tools"], data["server"])}
        try:
            self.store.put_listing(key, data, time.time())
        except TetherError:
            pass  # a cache: a store that cannot keep it costs the next command one server start

    def _signed_listing(self, key: str) -> tuple[dict[str, Any], float] | None:
        """The cached listing of ``key`` if tether signed it for that key, else None.

        Whether a tool is a read comes from its listing (``readOnlyHint``), so
        an unsigned, altered or moved row is never used: the server is then
        listed live, before any call is sent, and the cache rewritten signed.
        """
        if self.store is None:
            return None
        try:
            cached = self.store.get_listing(key)
        except TetherError:
            return None
        if cached is None or not isinstance(cached[0], dict):
            return None
        data, mac = cached[0], cached[0].get("mac")
        if not isinstance(mac, dict) or not isinstance(mac.get("mac"), str):
            return None
        signer = next((k for k in self._verify_with if secret_id(k) == mac.get("sid")), None)
        if signer is None or not same(
                Keyring.mac(signer, LISTING_PURPOSE, key, data.get("tools"), data.get("server")), mac["mac"]):
            return None
        return data, cached[1]

    # -- what runs need

    def recorded(self) -> list[dict[str, Any]]:
        """The definitions a run started in this process records: the sources whose tools it can see.

        A source that failed here gave the run no tools, so a process that
        continues the run need not load it either.
        """
        return [self.loaded[k].definition for k in self.own if k in self.loaded and self.loaded[k].ok]

    async def require(self, definitions: list[dict[str, Any]], *, live: Iterable[str] = (),
                      run_id: str | None = None, status: str | None = None) -> None:
        """Load ``definitions`` here (and start the namespaces in ``live``), or raise ToolsUnavailable."""
        problems: list[dict[str, str]] = []
        entries = []
        async with self._lock:
            for definition in definitions:
                ns = definition.get("namespace")
                other = next((e for e in self.loaded.values()
                              if ns and e.namespace == ns and e.ok and e.key != definition_key(definition)), None)
                if other is not None and ns:  # (other is found only under a namespace)
                    problems.append({"source": ns, "reason": "this process has a differently configured source "
                                     f"under the namespace {ns!r}" + (f" ({other.origin})" if other.origin else "")})
                    continue
                entries.append(await self._ensure(definition, None))
        for entry in entries:
            if not entry.ok:
                problems.append({"source": entry.name, "reason": entry.error or "failed to load"})
            elif entry.namespace in set(live) and entry.impl is not None:
                try:
                    await entry.impl.ensure_live()
                except TetherError as exc:
                    problems.append({"source": entry.name, "reason": exc.message})
        if problems:
            names = ", ".join(p["source"] for p in problems)
            why = "; ".join(f"{p['source']}: {p['reason']}" for p in problems)
            whose = f"run {run_id}" if run_id else "the run"
            state = f"; the run stays {status}" if status else ""
            raise ToolsUnavailable(
                f"sources {whose} was started with cannot be loaded here ({names}): {why}{state} "
                "and nothing was sent",
                details={"run_id": run_id, "status": status, "sources": problems},
            )

    def failures(self) -> dict[str, str]:
        """namespace -> error, for every source that failed to load here."""
        return {e.name: e.error or "failed" for e in self.loaded.values() if not e.ok}

    def statuses(self) -> list[LoadedSource]:
        return list(self.loaded.values())

    async def refresh(self, keys: Iterable[str] | None = None) -> list[LoadedSource]:
        """Start MCP sources and re-list their tools into the cache (``tether sources refresh``)."""
        out = []
        for entry in list(self.loaded.values()):
            if keys is not None and entry.key not in set(keys):
                continue
            if entry.ok and entry.impl is not None and kind_of(entry.type).caches_listing:
                try:
                    await entry.impl.ensure_live()
                except TetherError as exc:
                    self._fail(entry, exc.message)
            out.append(entry)
        return out

    def refresh_in_background(self, older_than: float = REFRESH_AFTER_SECONDS) -> asyncio.Task[None]:
        """Re-list, in a task, MCP servers whose cached listing is older than ``older_than`` seconds."""

        async def run() -> None:
            now = time.time()
            for entry in list(self.loaded.values()):
                lazy = entry.impl
                if isinstance(lazy, _LazyMCP) and not lazy.started and now - lazy.cached_at > older_than:
                    try:
                        await lazy.ensure_live()
                    except TetherError:
                        pass  # the cached tools stay; a call will say what is wrong

        task = asyncio.ensure_future(run())
        self._refreshing.append(task)
        return task

    def _relisted(self, entry: LoadedSource, lazy: _LazyMCP, source: Any) -> None:
        """A started server's listing replaces the cached one, in the store and in the catalog."""
        from tether._sources._mcp_tools import build_tools

        self._remember_listing(entry.key, source)
        if source.listing == lazy.listing:
            return
        tools, upstream, problems = build_tools(entry.name, source.listing, lazy.handler, lazy.ceiling,
                                                idempotency=entry.definition.get("idempotency", "none"))
        tools = with_undos(tools, entry.definition)
        catalog = self.catalog
        for tool in entry.tools:
            if tool.address in catalog:
                catalog.remove(tool.address)
        catalog.add_many(tools)
        entry.tools, entry.problems, lazy.upstream, lazy.listing = tools, problems, upstream, source.listing
        lazy._tools = tools

    async def close(self) -> None:
        for task in self._refreshing:
            task.cancel()
        await asyncio.gather(*self._refreshing, return_exceptions=True)
        for entry in self.loaded.values():
            if entry.impl is not None:
                try:
                    await entry.impl.close()
                except Exception:  # noqa: BLE001 - closing must reach every source
                    pass
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for log in self._logs:
            log.close()


class _SignedCatalogs:
    """Compiled OpenAPI catalogs in the store's listing cache, each signed with the store's secret.

    A catalog decides which calls are reads, so an entry that does not verify
    (written by hand, by another deployment, or altered) is ignored and the
    spec is compiled again, never trusted.
    """

    def __init__(self, store: Store, secrets: list[bytes]) -> None:
        self.store, self.secrets = store, secrets

    @staticmethod
    def _mac(secret: bytes, key: str, body: str) -> str:
        # The bytes it always signed; the MAC itself is the capabilities module's (_engine/approvals/capabilities.py).
        return mac_hex(secret, f"openapi-catalog:{key}\n{body}".encode())

    def get_text(self, key: str) -> str | None:
        try:
            row = self.store.get_listing(f"openapi:{key}")
        except TetherError:
            return None
        data = row[0] if row is not None else None
        if not (isinstance(data, dict) and isinstance(data.get("body"), str) and isinstance(data.get("mac"), str)):
            return None
        if not any(same(self._mac(s, key, data["body"]), data["mac"]) for s in self.secrets):
            return None
        return data["body"]

    def get(self, key: str) -> dict[str, Any] | None:
        body = self.get_text(key)
        if body is None:
            return None
        from tether._sources._openapi_compiled import no_gc

        try:
            with no_gc():
                found = json.loads(body)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def put(self, key: str, compiled: dict[str, Any]) -> None:
        self.put_text(key, json.dumps(compiled, separators=(",", ":"), default=str))  # default: YAML dates

    def put_text(self, key: str, text: str) -> None:
        try:
            self.store.put_listing(f"openapi:{key}", {"mac": self._mac(self.secrets[0], key, text), "body": text},
                                   time.time())
        except TetherError:
            pass  # a cache: the next start compiles again


class _LazyMCP:
    """An MCP source whose tools come from the listing cache: the server starts at the first call."""

    def __init__(self, owner: SourceSet, entry: LoadedSource, definition: dict[str, Any], timeout: float, *,
                 listing: dict[str, Any], cached_at: float) -> None:
        self.owner, self.entry, self.definition, self.timeout = owner, entry, definition, timeout
        self.upstream: dict[str, str] = {}
        self.server_info: dict[str, Any] = listing.get("server", {})
        self.listing: list[dict[str, Any]] = listing.get("tools", [])
        self.cached_at = cached_at
        ceiling = definition.get("max_call_seconds") or definition.get("call_timeout")
        self.ceiling = None if ceiling is None else float(ceiling) + 1.0
        self._tools: list[Tool] | None = None
        self._source: MCPSource | None = None
        self._lock = asyncio.Lock()
        self.started = False

    @property
    def problems(self) -> list[dict[str, str]]:
        return self.entry.problems

    @property
    def summary(self) -> str | None:
        from tether._sources._mcp_tools import server_summary

        return server_summary(self.server_info)

    async def start(self) -> None:
        """Build the tools from the cached listing; nothing is started."""
        from tether._sources._mcp_tools import build_tools

        self._tools, self.upstream, self.entry.problems = build_tools(
            self.definition["namespace"], self.listing, self.handler, self.ceiling,
            idempotency=self.definition.get("idempotency", "none"))

    def tools(self) -> list[Tool]:
        return list(self._tools or [])

    async def ensure_live(self) -> None:
        await self._live()

    async def _live(self) -> MCPSource:
        async with self._lock:
            if self._source is None:
                source = self.owner._build(self.definition, self.timeout)
                try:
                    await asyncio.wait_for(source.start(), self.timeout)
                except asyncio.TimeoutError:
                    await source.close()
                    raise SourceUnavailable(
                        f"MCP source {self.entry.name!r} did not start within {self.timeout:g} s (start_timeout); "
                        "the call was not sent", details={"source": self.entry.name}) from None
                except TetherError as exc:
                    await source.close()
                    raise SourceUnavailable(f"MCP source {self.entry.name!r} is unavailable: {exc.message}; "
                                            "the call was not sent", details={"source": self.entry.name}) from None
                self._source, self.started = source, True
                self.server_info = source.server_info
                self.owner._relisted(self.entry, self, source)
            return self._source

    def handler(self, name: str, upstream: str) -> Callable[[dict[str, Any]], Any]:
        async def call(args: dict[str, Any]) -> Any:
            source = await self._live()
            try:
                wire = source.upstream_name(name)
            except KeyError:
                raise SourceUnavailable(f"the MCP server no longer lists {upstream!r}; the call was not sent "
                                        "(`tether sources refresh` updates the cached listing)",
                                        details={"source": self.entry.name}) from None
            return await source.call(name, wire, args)

        call.__qualname__ = f"mcp:{self.entry.name}.{name}"
        return call

    async def close(self) -> None:
        if self._source is not None:
            await self._source.close()

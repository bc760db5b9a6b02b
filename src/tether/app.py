"""Assemble a Runtime from a config file: store, sources, policy, limits.

The CLI, the MCP server and the worker all start here, so a run started by one
can be resumed by another with the same tools.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

from .config import Config, load_config
from .errors import ConfigError, TetherError
from .runs.limits import Limits
from .runs.policy import Policy, Rule
from .runs.runtime import Runtime
from .store import open_store


@dataclass
class SourceStatus:
    """What `tether sources list` shows for one configured source."""

    name: str
    type: str
    ok: bool
    tools: int = 0
    error: str | None = None
    problems: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.name, "type": self.type, "ok": self.ok, "tools": self.tools, "error": self.error,
                "problems": self.problems}


def policy_from_config(config: Config) -> Policy:
    p = config.policy
    return Policy(writes=p.writes, write_budget=p.write_budget,
                  rules=tuple(Rule(r.match, r.action) for r in p.rules))


def limits_from_config(config: Config) -> Limits:
    return Limits.from_dict(config.limits.model_dump())


def resolve_tool_spec(spec: str) -> str:
    """A --tools value as it must be recorded to load it again elsewhere: files absolute."""
    if spec.endswith(".py") or os.sep in spec:
        return str(Path(spec).resolve())
    return spec


@contextlib.asynccontextmanager
async def open_runtime(
    config: Config | None = None,
    *,
    config_path: str | Path | None = None,
    tools: Sequence[str] = (),
    type_check: bool | None = None,
    store_url: str | None = None,
    strict_sources: bool = False,
) -> AsyncIterator[Runtime]:
    """A started Runtime with every configured source loaded; closes them on exit."""
    config = config or load_config(config_path)
    store = open_store(store_url or config.store.url)
    runtime = Runtime(
        store=store,
        policy=policy_from_config(config),
        limits=limits_from_config(config),
        min_workers=config.sandbox.min_workers,
        max_workers=config.sandbox.max_workers,
        type_check=config.sandbox.type_check if type_check is None else type_check,
        check=config.sandbox.check if type_check is None and config.sandbox.type_check is None else None,
        approval_ttl_seconds=config.policy.approval_ttl_seconds,
        checkpoint_every_calls=config.policy.checkpoint_every_calls,
        checkpoint_every_seconds=config.policy.checkpoint_every_seconds,
        # How long a dead process keeps its runs before another takes them over.
        lease_seconds=float(os.environ.get("TETHER_LEASE_SECONDS", "30")),
        local_runs=config.server.local_runs,
    )
    runtime.config = config
    runtime.source_status = []
    closers: list[Any] = []
    try:
        for spec in tools:
            runtime.add_tools(_load_python(resolve_tool_spec(spec)))  # checks namespaces
            runtime.source_status.append(SourceStatus(spec, "python", True, tools=len(runtime.catalog)))
        for source in config.sources:
            status = await _load_source(runtime, source, closers)
            runtime.source_status.append(status)
            if strict_sources and not status.ok:
                raise ConfigError(f"source {status.name} failed to load: {status.error}")
        await runtime.pool.start()
        from .server.notify import notifications

        # [[notify]] webhooks: queued as runs pause and end, delivered in the background.
        async with notifications(runtime, config):
            yield runtime
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                await close()
        await runtime.close()
        store.close()


def _load_python(spec: str) -> list[Any]:
    """The tools of a ``--tools`` module or file; a module that cannot load is a named error, not a traceback."""
    from .sources.python import tools_from_module

    try:
        return tools_from_module(spec)
    except TetherError:
        raise
    except SyntaxError as exc:
        raise ConfigError(f"--tools {spec}: syntax error on line {exc.lineno}: {exc.msg}; nothing was run",
                          code="tools_invalid", details={"tools": spec, "line": exc.lineno},
                          next_action=f"Fix {exc.filename or spec} (python -m py_compile shows the error).") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own code raised while importing
        raise ConfigError(f"--tools {spec}: importing it raised {type(exc).__name__}: {_short(exc)}; nothing was run",
                          code="tools_invalid", details={"tools": spec, "type": type(exc).__name__},
                          next_action=f"Fix the error {spec} raises at import time (python -c 'import ...' "
                                      "shows the traceback).") from None


def _short(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        return "(no message)"
    return text if len(text) <= 500 else text[:500] + "…"


async def _load_source(runtime: Runtime, source: Any, closers: list[Any]) -> SourceStatus:
    kind = source.type
    name = getattr(source, "namespace", None) or getattr(source, "module", "?")
    try:
        if kind == "python":
            from .sources.python import tools_from_module

            found = tools_from_module(source.module)
            import dataclasses

            if source.namespace:
                found = [dataclasses.replace(t, namespace=source.namespace) for t in found]
            if source.idempotency == "key":
                found = [dataclasses.replace(t, idempotency="key") for t in found]
            runtime.check_namespaces(found)
            runtime.catalog.add_many(found)
            return SourceStatus(name, kind, True, tools=len(found))
        if kind == "mcp":
            from .sources.mcp import MCPSource

            mcp = MCPSource(namespace=source.namespace, command=source.command, url=source.url,
                            env=source.env or None, headers=source.headers or None, cwd=source.cwd,
                            idempotency=source.idempotency)
            runtime.check_namespaces([mcp])
            mcp.elicitation_handler = runtime.elicitation_handler(source.namespace)
            await mcp.start()
            closers.append(mcp.close)
            found = mcp.tools()
            runtime.catalog.add_many(found)
            return SourceStatus(name, kind, True, tools=len(found), problems=list(getattr(mcp, "problems", [])))
        if kind == "openapi":
            from .sources.openapi import OpenAPISource

            api = OpenAPISource(namespace=source.namespace, spec=source.spec, base_url=source.base_url,
                                auth=source.auth.model_dump() if source.auth else None,
                                headers=source.headers or None, idempotency=source.idempotency,
                                idempotency_header=source.idempotency_header or None)
            runtime.check_namespaces([api])
            start = getattr(api, "start", None)
            if start is not None:
                await start()
            closers.append(api.close)
            found = api.tools()
            runtime.catalog.add_many(found)
            return SourceStatus(name, kind, True, tools=len(found), problems=list(getattr(api, "problems", [])))
        return SourceStatus(name, kind, False, error=f"unknown source type {kind!r}")
    except TetherError as exc:
        return SourceStatus(name, kind, False, error=str(exc))
    except Exception as exc:  # a source that cannot load must not stop the others
        return SourceStatus(name, kind, False, error=f"{type(exc).__name__}: {exc}")

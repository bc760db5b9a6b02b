"""Assemble a Runtime from a config file: store, sources, policy, limits.

The CLI, the MCP server and the worker all start here, so a run started by one
can be resumed by another with the same tools.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

from tether._runtime import Runtime
from tether._store import open_store
from tether.errors import ConfigError

if TYPE_CHECKING:
    # Imported when a config is loaded, not with `import tether` (its models take a while to build).
    from tether._config import Config


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
    sources: list[dict[str, Any]] | None = None,
    report: Callable[[str], None] | None = None,
) -> AsyncIterator[Runtime]:
    """A started Runtime with its sources loaded (concurrently); closes them on exit.

    ``sources`` are recorded definitions (a run's) to load instead of the
    config's own. ``report`` receives one line per source that failed.
    """
    from tether._config import load_config
    from tether._sources.loader import record_definition

    config = config or load_config(config_path)
    store = open_store(store_url or config.store.url)
    runtime = Runtime(
        store=store,
        policy=config.policy.recorded(),
        limits=config.limits,
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
        quotas=config.quotas.quotas(),
        run_signature=config.store.run_signature,
        # Its sources are set up with the engine (loaded below); the worker reads its [retention].
        config=config,
    )
    source_set = runtime.engine.sources
    assert source_set is not None  # a runtime built with a config has its source set
    try:
        python = [{"type": "python", "module": resolve_tool_spec(spec)} for spec in tools]
        for entry in await source_set.add(python, [f"--tools {spec}" for spec in tools]):
            if entry.exc is not None:  # named on the command line: a failure is the command's error
                raise entry.exc
        if sources is None:
            where = str(config.path) if config.path else "<config>"
            definitions = [record_definition(s, source_set.secret) for s in config.sources]
            origins: list[str | None] = [f"{where}: sources[{i}]" for i in range(len(definitions))]
        else:
            definitions, origins = list(sources), ["recorded with the run"] * len(sources)
        entries = await source_set.add(definitions, origins)
        failed = [e for e in source_set.statuses() if not e.ok]
        for entry in failed:
            if report is not None:
                report(f"tether: source {entry.name!r} ({entry.origin}) failed: {entry.error}")
        if strict_sources and failed:
            raise ConfigError(f"source {failed[0].name} failed to load: {failed[0].error}")
        del entries
        await runtime.engine.pool.start()
        if not config.notify:
            # No [[notify]]: nothing to queue or deliver, and no need to import the server's notifier.
            yield runtime
            return
        from tether._server.notify import notifications

        # [[notify]] webhooks: queued as runs pause and end, delivered in the background.
        async with notifications(runtime, config):
            yield runtime
    finally:
        await source_set.close()
        await runtime.close()
        store.close()

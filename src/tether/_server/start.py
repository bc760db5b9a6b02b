"""Starting ``tether serve``: typed options, the checks before anything listens, the transports.

The command line builds a :class:`ServeOptions`; anything else that starts a
server (a test, an embedding program) builds one the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tether._engine.approvals import Access
from tether._hostwork import GraceOnSignal
from tether._logs import say
from tether._server.admission import Admission
from tether._server.auth import (
    MIN_TOKEN_CHARS,
    BearerAuth,
    HealthRoutes,
    is_loopback,
    principal_for_token,
    principal_of_request,
    short_tokens,
    split_tokens,
    well_formed,
)
from tether._server.ended_sessions import EndedSessions
from tether._server.mcp import TetherServer
from tether._store.base import Store
from tether.errors import (
    ConfigError,
    InvalidArguments,
    TokenInvalid,
    TokenRequired,
    TokenTooShort,
    UnsafeBind,
)


@dataclass(frozen=True)
class ServeOptions:
    """What starts a server; the config file (``[server]``) supplies the rest.

    ``http`` is ``HOST:PORT`` (either part may be left out: ``[server]`` host
    and port fill it); ``None`` serves over standard input/output.
    """

    config_path: str | None = None
    tools: Sequence[str] = ()
    http: str | None = None
    dev: bool = False  # allow HTTP without a token, on a loopback address only


def parse_address(value: str, default_host: str, default_port: int) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT``, ``:PORT`` or ``HOST`` (the missing part from [server])."""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif value.count(":") == 1:
        host, port = value.split(":")
    else:  # a bare host, or a bare IPv6 address
        host, port = value, ""
    host = host or default_host
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise InvalidArguments(f"--http takes HOST:PORT, not {value!r}",
                               next_action="Pass e.g. --http 127.0.0.1:8765.") from None
    if not 0 < number < 65536:
        raise InvalidArguments(f"port {number} is out of range",
                               next_action="Pass a port between 1 and 65535.")
    return host, number


def check_http_auth(host: str, tokens: tuple[str, ...], dev: bool, *, oauth: bool = False,
                    dev_by: str = "--dev") -> None:
    """Refuse to serve HTTP that anyone could call: a token, an identity provider ([auth]), or --dev on loopback."""
    if dev and not is_loopback(host):
        raise UnsafeBind(
            f"{dev_by} serves without a token, so it binds only to a loopback address, not {host}; nothing was "
            "started", next_action=f"Bind to 127.0.0.1, or set TETHER_TOKEN and drop {dev_by}.")
    if not tokens and not dev and not oauth:
        raise TokenRequired(
            "serving MCP over HTTP needs a bearer token; nothing was started",
            next_action="Set TETHER_TOKEN (or [server] token in tether.toml), or pass --dev to serve "
                        "without one on 127.0.0.1.")
    if not all(well_formed(t) for t in tokens):
        raise TokenInvalid(
            "a bearer token may hold only letters, digits and -._~+/= (RFC 7235 token68); nothing was started",
            next_action="Generate one with `openssl rand -hex 32` and set it as TETHER_TOKEN.")
    short = short_tokens(tokens)
    if short and not dev:
        raise TokenTooShort(
            f"{len(short)} bearer token(s) shorter than {MIN_TOKEN_CHARS} characters (lengths "
            f"{', '.join(map(str, short))}); a short token can be guessed, so nothing was started",
            next_action="Generate one with `openssl rand -hex 32` and set it as TETHER_TOKEN "
                        "(--dev accepts short tokens on loopback, with a warning).")
    if short:
        say(f"tether: warning: a bearer token is shorter than {MIN_TOKEN_CHARS} characters; "
            f"accepted only because of {dev_by}", level=logging.WARNING)


def warn_if_secret_beside_data(store: Store) -> bool:
    """Say loudly when the signing secret is a row of the database it protects (P-35)."""
    if not store.capabilities.secret_with_data or store.secret_source != "stored":
        return False
    say(
        "WARNING: tether's signing secret is stored in the same Postgres database as the runs it signs.\n"
        "WARNING: whoever can write those tables can read the secret and forge a run's program, policy or\n"
        "WARNING: journal. Set TETHER_SECRET or TETHER_SECRET_FILE (a file only this service can read).",
        level=logging.WARNING,
    )
    return True


def _absolute(path: str | None) -> str | None:
    # Recorded with each run, so another process can find the same config file.
    return str(Path(path).resolve()) if path else None


async def serve(options: ServeOptions) -> int:
    """``tether serve --stdio | --http HOST:PORT [--dev]``: serve until stdin closes or a signal."""
    from tether._app import resolve_tool_spec
    from tether._config import load_config

    config = load_config(options.config_path)
    from tether._logs import configure_from

    configure_from(config.log)
    tools = [resolve_tool_spec(t) for t in options.tools]
    import os

    from tether._engine.approvals.grants import server_access

    address: tuple[str, int] | None = None
    if options.http is not None:
        address = parse_address(options.http, config.server.host, config.server.port)
    # Every token the server accepts, each with its rights ([[server.tokens]], TETHER_TOKEN).
    access, tokens = server_access(config.server, split_tokens(config.server.token), os.environ,
                                   principal_for_token, http=address is not None,
                                   oauth=address is not None and config.auth is not None)
    resource = None
    if address is not None:
        check_http_auth(address[0], tokens, options.dev or config.server.allow_unauthenticated_loopback,
                        oauth=config.auth is not None,
                        dev_by="--dev" if options.dev else "[server] allow_unauthenticated_loopback")
        if config.auth is not None:
            from tether._server.oauth import ResourceServer

            # Checked now, against the IdP itself: a wrong issuer or unreachable keys refuse to start.
            resource = await ResourceServer.from_config(config.auth, config.server.public_url, os.environ)
    if config.server.approvals == "url" and not config.server.public_url:
        raise ConfigError("[server] approvals = \"url\" sends approval links, and there is no [server] public_url "
                          "to build them on; nothing was started",
                          next_action="Set [server] public_url to where people reach this server, or use "
                                      "approvals = \"auto\".")
    run_meta = {"tools": tools, "config": _absolute(options.config_path)}

    def report(line: str) -> None:
        say(line, level=logging.WARNING)

    from tether._hostwork import LoopWatchdog

    loop = asyncio.get_running_loop()
    watchdog = LoopWatchdog(loop, threshold=config.server.loop_stall_seconds, report=report).start()
    # A signal asks the server to stop; by shutdown_grace_seconds the process exits whatever a run is doing.
    # Over HTTP uvicorn's listener takes the signals while it serves, with the same grace (_serve_http).
    stopping = asyncio.Event()
    grace = GraceOnSignal(lambda sig: loop.call_soon_threadsafe(stopping.set),
                          grace=config.server.shutdown_grace_seconds, report=report)
    try:
        with grace.installed():
            code = await _serve_runtime(options, config, tools, tokens, access, resource, address, run_meta,
                                        report, watchdog, stopping)
    finally:
        watchdog.stop()
    if address is None and stopping.is_set():
        # Stopped by a signal while the client kept stdin open: the MCP SDK reads stdin in a thread that
        # nothing interrupts, and leaving would wait for the client's next line. The runtime is closed,
        # nothing is left to finish: exit now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


async def _serve_runtime(options: ServeOptions, config: Any, tools: list[Any], tokens: tuple[str, ...],
                         access: Access, resource: Any, address: tuple[str, int] | None, run_meta: dict[str, Any], report: Any,
                         watchdog: Any, stopping: asyncio.Event) -> int:
    from tether._app import open_runtime

    async with open_runtime(config, tools=tools, report=report) as rt:
        warn_if_secret_beside_data(rt.store)
        server = TetherServer(
            rt,
            admission=Admission(config.server.max_concurrent_runs, config.server.queue_depth,
                                config.server.queue_timeout_seconds),
            # Without tokens nobody is told apart: stdio, and --dev on loopback.
            principal_of=principal_of_request if address is not None and (tokens or resource) else None,
            run_meta=run_meta,
            approvals=config.server.approvals,
            public_url=config.server.public_url,
            task_after_seconds=float(config.server.task_after_seconds),
            form_wait_seconds=float(config.server.form_wait_seconds),
            access=access,
            console=address is not None,
        )
        # The server is also a runner (P-19): it executes queued runs, wakes
        # timers and due waits, and takes over runs whose process died.
        from tether._engine.worker import Worker

        if rt.engine.sources is not None:  # open_runtime always sets it
            rt.engine.sources.refresh_in_background()
        stop_worker = asyncio.Event()
        runner = asyncio.ensure_future(Worker(rt.engine).work(stop=stop_worker))
        try:
            if address is None:
                await _serve_stdio(server, stopping)
            else:
                await _serve_http(server, *address, tokens, public_url=config.server.public_url,
                                  stateless=config.server.stateless_http, watchdog=watchdog,
                                  grace=config.server.shutdown_grace_seconds, report=report, resource=resource,
                                  auth=config.auth, settings=config.server, metrics_listen=config.metrics.listen,
                                  stopping=stopping)
        finally:
            stop_worker.set()
            with contextlib.suppress(Exception):
                await runner
            await server.close()
    return 0


async def _serve_stdio(server: TetherServer, stopping: asyncio.Event) -> None:
    """Serve MCP on stdin/stdout until stdin closes or a signal asks to stop."""
    stdio = asyncio.ensure_future(server.mcp.run_stdio_async())
    asked = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({stdio, asked}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        asked.cancel()
    if stdio.done():
        stdio.result()
    else:
        stdio.cancel()  # not awaited: its read of stdin ends only with the client's next line (serve exits)


async def _serve_http(server: TetherServer, host: str, port: int, tokens: tuple[str, ...], *,
                      public_url: str | None = None, stateless: bool = False, watchdog: Any = None,
                      grace: float = 15.0, report: Any = print, resource: Any = None, auth: Any = None,
                      settings: Any = None, metrics_listen: str | None = None,
                      stopping: asyncio.Event | None = None) -> None:
    import uvicorn

    from tether._config import ServerConfig
    from tether._server.connections import BodyDeadline, uvicorn_options
    from tether._server.console import Console, Router
    from tether._server.metrics import MetricsApp, MetricsRoute

    class Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            # uvicorn re-raises SIGINT/SIGTERM once it has shut down, which
            # would kill the process before tether closes its runtime; here a
            # signal only asks it to stop, and `tether serve` returns normally
            # (or exits after the grace period if a run holds the loop).
            with GraceOnSignal(lambda sig: self.handle_exit(sig, None), grace=grace, report=report).installed():
                yield

    class SideListener(uvicorn.Server):
        # Ends with the main listener and takes no signals: installing its own handler would replace the
        # main one's, and the first SIGTERM would stop only this listener (seen).
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    async def ready() -> bool:
        if watchdog is not None and watchdog.stuck:
            return False  # the loop is stuck: a balancer should send work elsewhere
        # One cheap read through the store's own connection: a store that
        # answers it can serve runs. Off the loop, as every store call should be.
        await asyncio.to_thread(server.rt.store.get_run, "run_readiness_probe")
        return True

    # Health first: a balancer's probe carries no token. The console signs
    # people in with the same tokens and has its own checks; MCP requests
    # keep the bearer check.
    console = Console(server.rt, tokens=tokens, admission=server.admission, public_url=public_url, host=host,
                      access=server.access, sign_in=_sign_in(server, resource, auth, public_url, host, port),
                      dev=not tokens and resource is None)
    quotas = server.rt.engine.settings.quotas
    mcp_app = mcp_asgi(server, host, stateless, public_url)
    # Each door checks the rights it needs (P-44): /mcp here, /metrics in MetricsRoute, the console per route.
    mcp: Any = BearerAuth(mcp_app, tokens, resource, access=server.access,
                          session_quota=(lambda p: quotas.of(p).mcp_sessions) if quotas is not None else None)
    if resource is not None:
        from tether._server.oauth import MetadataRoutes

        mcp = MetadataRoutes(mcp, resource)
    settings = settings or ServerConfig()
    app = BodyDeadline(HealthRoutes(Router(console.app, MetricsRoute(mcp, server.rt, tokens, resource, server.access)), ready),
                       settings.body_timeout_seconds)
    shown = f"[{host}]" if ":" in host else host
    how = ("bearer token or OAuth access token" if resource is not None else
           "bearer token required" if tokens else "no token, loopback only")
    say(f"tether: serving MCP at http://{shown}:{port}/mcp ({how}), the console at http://{shown}:{port}/console/")
    # What is built by now (modules, pydantic models, the catalog, the app) lives as long as the server: frozen
    # out of the cyclic collector's sight, a full collection walks only what requests made. Under serve_bench's
    # load a full collection paused the loop 124 ms, and 14 ms frozen (serve_bench.py).
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            # Open SSE streams would otherwise hold a shutdown forever.
                            timeout_graceful_shutdown=5, **uvicorn_options(settings))
    scrape = None
    if metrics_listen:
        # No token on this listener: it is for a network only the scraper reaches (docs/deploy.md).
        m_host, m_port = parse_address(metrics_listen, "127.0.0.1", 9464)
        scrape = SideListener(uvicorn.Config(MetricsApp(server.rt), host=m_host, port=m_port,
                                              log_level="warning", lifespan="off", **uvicorn_options(settings)))
        say(f"tether: metrics at http://{m_host}:{m_port}/metrics (no token)")
    main = Uvicorn(config)
    # A signal before uvicorn takes the signals over (while it starts) reached serve's own handler: it asked
    # for a stop that uvicorn would never hear, and the server went on serving (seen: a SIGTERM right after
    # the "serving" line). Whenever that handler asks, uvicorn stops too.
    asked = asyncio.ensure_future(stopping.wait()) if stopping is not None else None
    if asked is not None:
        asked.add_done_callback(lambda t: None if t.cancelled() else setattr(main, "should_exit", True))
    try:
        if scrape is None:
            await main.serve()
        else:
            side = asyncio.ensure_future(scrape.serve())
            try:
                await main.serve()
            finally:
                scrape.should_exit = True
                with contextlib.suppress(Exception):
                    await side
    finally:
        if asked is not None:
            asked.cancel()
        await console.close()


def mcp_asgi(server: TetherServer, host: str, stateless: bool, public_url: str | None) -> Any:
    """The SDK's streamable HTTP app for ``/mcp``; a message reaching a session as its client ends it is one line,
    not the SDK's two tracebacks (D-92)."""
    return EndedSessions(server.mcp.streamable_http_app(host=host, stateless_http=stateless,
                                                        transport_security=_mcp_hosts(host, public_url)))


def _mcp_hosts(host: str, public_url: str | None) -> Any:
    """The SDK's Host and Origin checks for ``/mcp`` on a loopback bind, with ``public_url``'s host added.

    None leaves the SDK's own rule (loopback names on a loopback bind, no check
    otherwise); the console applies the same names (``auth.allowed_hosts``).
    """
    if not public_url or not is_loopback(host):
        return None
    from urllib.parse import urlsplit

    from mcp.server.transport_security import TransportSecuritySettings

    public = urlsplit(public_url)
    loopback = ["127.0.0.1", "localhost", "[::1]"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in loopback] + [public.netloc, f"{public.hostname}:*"],
        allowed_origins=[f"http://{h}:*" for h in loopback] + [f"{public.scheme}://{public.netloc}"])


def _sign_in(server: TetherServer, resource: Any, auth: Any, public_url: str | None, host: str, port: int) -> Any:
    """The console's OpenID Connect sign-in, when [auth] names a console client; else None (token sign-in only)."""
    if resource is None or auth is None or not auth.console_client_id:
        return None
    from tether._server.signin import OidcSignIn

    base = (public_url or f"http://{'[' + host + ']' if ':' in host else host}:{port}").rstrip("/")
    return OidcSignIn(resource, client_id=auth.console_client_id, client_secret=resource.client_secret,
                      redirect_uri=f"{base}/console/oidc/callback")

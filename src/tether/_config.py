"""Configuration: one TOML file, validated, with every problem reported at once.

``load_config(path)`` reads ``tether.toml`` (or defaults when there is none),
applies the environment (``TETHER_HOME``, ``TETHER_STORE_URL``,
``TETHER_SECRET``, ``TETHER_TOKEN``) and returns a frozen :class:`Config`.

A bad file raises one :class:`~tether.errors.ConfigError` listing every bad
key, one line each, in the form ``<file>: <toml.path>: <what is expected>``.
Pydantic does the checking; its errors are rewritten here into those lines
because a raw validation dump names Python types, not the keys a user wrote.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import PolicyConfig
from tether._fields import (
    Bool,
    Days,
    EnvName,
    Expected,
    HttpUrl,
    NonNegativeInt,
    Port,
    PositiveInt,
    Seconds,
    StoreUrl,
    StrList,
    Text,
    checked_fields,
)
from tether._sources.kinds import SourceDefinition
from tether._store import backend_for, expected_url
from tether.errors import ConfigError

__all__ = [
    "Config",
    "LogConfig",
    "MetricsConfig",
    "NotifyConfig",
    "QuotaConfig",
    "QuotasConfig",
    "RetentionConfig",
    "SandboxConfig",
    "ServerConfig",
    "StoreConfig",
    "load_config",
]

DEFAULT_FILE = "tether.toml"
DEFAULT_HOME = ".tether"
_REDACTED = "<redacted>"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- [limits], [policy] ------------------------------------------------------
# Parsed straight into the engine's own value objects (tether._engine.rules.limits.Limits,
# tether._engine.rules.policy.PolicyConfig): each field is declared once, with its reason, there.


# --- [store] -----------------------------------------------------------------


class StoreConfig(_Section):
    # Relative to the default TETHER_HOME; load_config writes the absolute
    # path of the home in force.
    url: StoreUrl = f"sqlite:///{DEFAULT_HOME}/tether.db"
    # The format runs are signed in (D-55, P-35): 2 signs which fields carry a MAC; 1 is the format of the
    # release before, which its replicas can read — set it only while such replicas still run (docs/deploy.md
    # "Upgrading"). Both formats verify either way.
    run_signature: Literal[1, 2] = 2


# --- [retention] -------------------------------------------------------------


class RetentionConfig(_Section):
    """How long ended runs are kept (tether._store.retention); paused, waiting and running runs always are."""

    # A month answers "what did that agent do last week?"; failures are kept
    # longer because they are what someone comes back to investigate.
    completed_days: Days = 30
    failed_days: Days = 90
    cancelled_days: Days = 30
    # A rolled-back run is kept as long as a failure: someone comes back to see what was undone (P-46).
    rolled_back_days: Days = 90
    # true: a run past its days keeps its row, result and journal (audit);
    # only its snapshots, events and waits go.
    keep_journals: Bool = False
    # The worker prunes this many runs per transaction, every so often: short
    # transactions never hold SQLite's one writer for long.
    batch: PositiveInt = 100
    every_seconds: Seconds = 300

    def rules(self) -> Any:
        from tether._store.retention import RetentionRules

        days = {"completed": self.completed_days, "failed": self.failed_days, "cancelled": self.cancelled_days,
                "rolled_back": self.rolled_back_days}
        return RetentionRules({k: (v or None) for k, v in days.items()}, keep_journals=self.keep_journals)


# --- [quotas] ----------------------------------------------------------------


class QuotaConfig(_Section):
    """One principal's quotas (tether._engine.rules.quotas); 0 is unlimited."""

    # Defaults that stop one runaway agent, not normal work, and keep one token from holding every run slot
    # or filling the disk (D-62). The operator (`local`: CLI, Python API, stdio) is not bounded by the two
    # below unless they are set here or under [quotas.principals.local].
    concurrent_runs: NonNegativeInt = 16  # queued or running
    # Counted in steps of period_seconds / 60 (D-54): a run counts until its whole step has left the window.
    runs_per_period: NonNegativeInt = 10_000
    period_seconds: Seconds = 3600
    # Measuring it reads every row a principal owns (once a minute per principal and process): a server pays
    # that, and a CLI start does not (local is left out unless this is set).
    stored_bytes: NonNegativeInt = 1 << 30
    repl_sessions: NonNegativeInt = 1000
    # ~38 KB each in the MCP SDK (measured): 1,000 idle sessions cost one token ~38 MB.
    mcp_sessions: NonNegativeInt = 1000

    def quota(self) -> Any:
        from tether._engine.rules.quotas import Quota

        return Quota(concurrent_runs=self.concurrent_runs or None, runs_per_period=self.runs_per_period or None,
                     period_seconds=self.period_seconds, stored_bytes=self.stored_bytes or None,
                     repl_sessions=self.repl_sessions or None, mcp_sessions=self.mcp_sessions or None)


# Default quotas the operator's own runs are not held to (0: unlimited), unless [quotas] sets them.
OPERATOR_UNBOUNDED = ("concurrent_runs", "stored_bytes")
LOCAL_PRINCIPAL = "local"


class QuotasConfig(QuotaConfig):
    # Per principal (the id `tether runs list` and the console show, "local" without a
    # token): a table with any of the keys above; the rest come from here.
    principals: Annotated[dict[str, QuotaConfig], Expected("must be a table of tables, one per principal")] = Field(
        default_factory=dict)

    def quotas(self) -> Any:
        from tether._engine.rules.quotas import Quotas

        base = self.model_dump(exclude={"principals"})
        overrides = {p: QuotaConfig(**{**base, **q.model_dump(exclude_unset=True)}).quota()
                     for p, q in self.principals.items()}
        operator = {k: 0 for k in OPERATOR_UNBOUNDED if k not in self.model_fields_set}
        if operator and LOCAL_PRINCIPAL not in overrides:
            overrides[LOCAL_PRINCIPAL] = QuotaConfig(**{**base, **operator}).quota()
        return Quotas(default=self.quota(), principals=overrides)


# --- [log] and [metrics] -----------------------------------------------------


class LogConfig(_Section):
    # "json": one object per line with run_id / correlation_id fields, for a log pipeline.
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


class MetricsConfig(_Section):
    # GET /metrics is always served behind the token on the main listener;
    # "host:port" here adds a listener without a token, for a scrape network.
    listen: Text | None = None


# --- [sandbox] ---------------------------------------------------------------


class SandboxConfig(_Section):
    # One warm worker starts a run in ~0.1 ms instead of ~5 ms cold.
    min_workers: PositiveInt = 1
    # Each worker may hold memory_bytes; two keep a laptop's footprint small.
    max_workers: PositiveInt = 2
    # The pre-run check (README "The pre-run check"). "calls": tether's own
    # check of every tool call the program makes (addresses, arity, argument
    # names, literal values), microseconds; "full": also the bundled type
    # checker on stubs of what the program reaches, ~10-30 ms the first time a
    # program is seen; "off".
    check: Literal["calls", "full", "off"] = "calls"
    # The older switch: false means check = "off", true means "full".
    type_check: Bool | None = None

    @model_validator(mode="after")
    def _workers_order(self) -> SandboxConfig:
        if self.min_workers > self.max_workers:
            raise PydanticCustomError(
                "tether",
                "must not exceed max_workers ({max}) (got {min})",
                {"key": "min_workers", "min": self.min_workers, "max": self.max_workers},
            )
        return self


# --- [server] ----------------------------------------------------------------


Right = Literal["run", "approve", "metrics", "operate"]


class TokenConfig(_Section):
    """One bearer token and what its holder may do (``[[server.tokens]]``; docs/security.md)."""

    # Shown in the console and recorded with each decision this token takes.
    name: Annotated[str, Strict(), Field(min_length=1, max_length=64), Expected("must be a short non-empty name")]
    # The token itself comes from the environment, never the file.
    token_env: EnvName
    # run: execute, see and cancel its runs, decline their writes; approve: decide
    # writes (of the runs of `approves_for`; its own only with self_approval);
    # metrics: scrape /metrics; operate: everything, on every principal's runs (P-44).
    rights: Annotated[list[Right], Field(min_length=1),
                      Expected("must be a non-empty list of 'run', 'approve', 'metrics', 'operate'")] = Field(
        default_factory=lambda: list[Right](["run"]))
    # Names of other [[server.tokens]] (or "TETHER_TOKEN", or "*" for every
    # principal) whose runs this token may approve.
    approves_for: Annotated[list[Annotated[str, Strict()]], Expected("must be a list of token names")] = Field(
        default_factory=list)


class ServerConfig(_Section):
    # Loopback: nothing is exposed until someone chooses to.
    host: Text = "127.0.0.1"
    port: Port = 8765
    # TETHER_TOKEN wins over this, so the file need not hold a secret.
    token: Text | None = None
    allow_unauthenticated_loopback: Bool = False
    # Runs started without a token (CLI, Python API, stdio) belong to `local`.
    # "private": callers with a token never see them; "shared": they may act
    # on them too (one trusted team behind one server).
    local_runs: Literal["private", "shared"] = "private"
    # Defaults to sandbox.max_workers (filled in by Config): more concurrent
    # runs than workers would only wait for a worker inside the sandbox.
    max_concurrent_runs: PositiveInt = 2
    # Enough to absorb a burst from a few agents; beyond that callers get
    # `overloaded` with a retry hint instead of waiting blind.
    queue_depth: NonNegativeInt = 16
    queue_timeout_seconds: Seconds = 10
    # The event loop is stuck when it has not run a watchdog's beat for this long: /readyz answers 503
    # and the log names the run and call it is executing (docs/deploy.md).
    loop_stall_seconds: Seconds = 2
    # SIGTERM or SIGINT: past this the process exits whatever a run is doing; its lease lapses and
    # another process takes the run over (P-16), or quarantines it (P-39).
    shutdown_grace_seconds: Seconds = 15
    # Where people reach this server (behind a proxy, its public address):
    # approval links are built on it. Without it there are no links.
    public_url: HttpUrl | None = None
    # How a paused write is put to an MCP client's user: "url" sends the
    # approval link (URL-mode elicitation), "form" a form, "auto" the link
    # when the client declares URL elicitation and public_url is set.
    approvals: Annotated[Literal["url", "form", "auto"], Expected("must be one of 'url', 'form', 'auto'")] = "auto"
    # MCP Tasks (P-47): a client declaring the extension gets a task instead of a result once execute's run
    # pauses, parks, or is still running after this long (a client's tool-call timeout is a minute or two).
    task_after_seconds: Seconds = 5
    # An approval form asked inside the call (2025-11-25) unanswered this long declines its write (D-88):
    # the client that asked may be gone without a word (the TypeScript SDK's close() ends no session),
    # and the run holds a slot and a sandbox worker while it waits. A client still there gave up on the
    # call long before (the official TypeScript client gives a request 60 s).
    form_wait_seconds: Seconds = 600
    # Several replicas behind a balancer without sticky routing: no MCP session
    # is kept in a process's memory, so any replica answers any request
    # (2025-11-25 clients then get no mid-call requests; see docs/deploy.md).
    stateless_http: Bool = False
    # Connection hygiene (a proxy in front should time out first; docs/deploy.md).
    # A connection idle between requests is closed after this long.
    keep_alive_seconds: Seconds = 5
    # A request's headers must arrive within this long of the connection opening,
    # and its body within body_timeout_seconds of its headers: slow senders
    # (slowloris) do not hold a connection slot.
    header_timeout_seconds: Seconds = 10
    body_timeout_seconds: Seconds = 30
    # Open connections beyond this are refused with 503 instead of queued.
    max_connections: PositiveInt = 1000
    # Named tokens with rights; TETHER_TOKEN / `token` stay accepted beside them
    # (rights run and approve, its own runs only: see self_approval).
    tokens: Annotated[list[TokenConfig], Expected("must be an array of tables, written [[server.tokens]]")] = Field(
        default_factory=list)
    # Whether the principal that ran a program may approve its own writes
    # (MCP `resume`, the console signed in with its token, a link page). RISK:
    # the agent holds that token, so with true a prompt-injected model can
    # approve what it was told to ask about. Unset: false over HTTP with
    # tokens, true on standard input/output and --dev (docs/decisions.md D-31).
    self_approval: Bool | None = None
    # How an approval link decides: "signed_in" (the page shows the write to
    # whoever holds the link; deciding needs a console sign-in) or
    # "capability" (holding the link is enough). RISK of "capability": whoever
    # gets the link (a forwarded e-mail, an agent that fetched it) approves.
    links: Literal["signed_in", "capability"] = "signed_in"

    @model_validator(mode="after")
    def _known_approvers(self) -> "ServerConfig":
        names = [t.name for t in self.tokens]
        if len(set(names)) != len(names):
            raise PydanticCustomError("tether", "[[server.tokens]] names must be unique", {"key": "tokens"})
        reserved = [n for n in names if n == "*" or n.startswith("TETHER_TOKEN")]
        if reserved:
            # Those names stand for TETHER_TOKEN's tokens and for everyone in approves_for and the timeline.
            raise PydanticCustomError("tether", "[[server.tokens]] name '{name}' is reserved",
                                      {"key": "tokens", "name": reserved[0]})
        known = set(names) | {"*", "TETHER_TOKEN"}
        for t in self.tokens:
            unknown = [n for n in t.approves_for if n not in known]
            if unknown:
                raise PydanticCustomError(
                    "tether", "approves_for names {unknown}, not a [[server.tokens]] name, 'TETHER_TOKEN' or '*'",
                    {"key": "tokens", "unknown": ", ".join(unknown)})
        return self


# --- [auth] ------------------------------------------------------------------


JwsAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


class ClaimRight(_Section):
    """A right given to whoever's token (or console sign-in) has ``claim`` holding one of ``values``."""

    claim: Text
    values: StrList


class AuthConfig(_Section):
    """An OAuth 2.1 authorization server (the organisation's IdP) whose tokens tether accepts (docs/security.md).

    Agents send access tokens the IdP issued for tether's resource (its
    audience); people sign in to the console with OpenID Connect against the
    same issuer. Static tokens ([server] token, [[server.tokens]]) keep working beside it.
    """

    # The IdP's issuer identifier, exactly as its tokens' `iss` says it.
    issuer: HttpUrl
    # tether's canonical resource URL: the `aud` its access tokens must name.
    # Unset: [server] public_url + "/mcp".
    audience: HttpUrl | None = None
    # Unset: the `jwks_uri` of the issuer's discovery document.
    jwks_url: HttpUrl | None = None
    # Pinned: a token naming any other algorithm (or `none`) is refused before its key is looked up.
    algorithms: Annotated[list[JwsAlgorithm], Field(min_length=1),
                          Expected("must be a non-empty list of JWS algorithms such as 'RS256'")] = Field(
        default_factory=lambda: list[JwsAlgorithm](["RS256"]))
    # Clock skew allowed on exp/nbf/iat between the IdP and this server.
    leeway_seconds: Annotated[int, Strict(), Field(ge=0, le=300),
                              Expected("must be a whole number of seconds from 0 to 300")] = 30
    # RFC 7662 introspection for tokens that are not JWTs (opaque tokens); tether authenticates to it
    # with the console client below (console_client_id and its secret).
    introspection_url: HttpUrl | None = None
    # The console's OpenID Connect client; its secret comes from the environment, never the file.
    console_client_id: Text | None = None
    console_client_secret_env: EnvName | None = None
    # Rights besides the scopes tether:run / tether:approve / tether:operate,
    # e.g. [auth.rights.approve] claim = "groups", values = ["approvers"].
    rights: dict[Right, ClaimRight] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _console_client(self) -> "AuthConfig":
        if self.console_client_secret_env and not self.console_client_id:
            raise PydanticCustomError("tether", "console_client_secret_env needs console_client_id",
                                      {"key": "console_client_id"})
        return self


# --- [[notify]] --------------------------------------------------------------

NotifyEvent = Literal["paused", "waiting", "failed", "completed", "cancelled"]


class NotifyConfig(_Section):
    # Where the signed JSON event is POSTed.
    url: HttpUrl
    # The HMAC-SHA256 signing secret comes from the environment, never the file.
    secret_env: EnvName
    events: Annotated[list[NotifyEvent], Field(min_length=1),
                      Expected("must be a non-empty list of 'paused', 'waiting', 'failed', 'completed', "
                                "'cancelled'")] = Field(
        default_factory=lambda: list(get_args(NotifyEvent)))


# --- [[sources]] -------------------------------------------------------------
# Each table is one of the registered source kinds (tether._sources.kinds): its model, builder and
# capabilities are registered there, so a new kind does not edit this file.


# --- the whole file ----------------------------------------------------------


class Config(_Section):
    """The configuration in force. Build it with :func:`load_config` or :meth:`from_dict`."""

    limits: Limits = Field(default_factory=Limits)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    sources: Annotated[list[SourceDefinition], Expected("must be an array of tables, written [[sources]]")] = Field(
        default_factory=list
    )
    notify: Annotated[list[NotifyConfig], Expected("must be an array of tables, written [[notify]]")] = Field(
        default_factory=list
    )
    auth: AuthConfig | None = None

    _home: Path = Path(DEFAULT_HOME)
    _path: Path | None = None
    _secret: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data: Any) -> Any:
        # max_concurrent_runs follows sandbox.max_workers unless set. Done on
        # the raw data so the field stays a plain int after validation.
        if not isinstance(data, dict):
            return data
        server, sandbox = data.get("server", {}), data.get("sandbox", {})
        if isinstance(server, dict) and isinstance(sandbox, dict) and "max_concurrent_runs" not in server:
            workers = sandbox.get("max_workers", SandboxConfig.model_fields["max_workers"].default)
            if type(workers) is int and workers > 0:
                data = {**data, "server": {**server, "max_concurrent_runs": workers}}
        return data

    @property
    def home(self) -> Path:
        """TETHER_HOME (absolute once loaded): where the default store and local state live."""
        return self._home

    @property
    def path(self) -> Path | None:
        """The file this config was read from; None when only defaults apply."""
        return self._path

    @property
    def secret(self) -> str | None:
        """TETHER_SECRET, if set. Never written to the config file or to_dict()."""
        return self._secret

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        source: str = "<config>",
        base_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Config:
        """Validate parsed TOML. ``source`` names the file in error messages;
        relative source paths resolve against ``base_dir`` (default: cwd)."""
        env = os.environ if env is None else env
        problems: list[tuple[str, str]] = []  # (TOML path, what is wrong)
        config: Config | None = None
        try:
            config = cls.model_validate(dict(data))
        except ValidationError as exc:
            problems += _describe_errors(exc)
        problems += _duplicate_namespaces(data.get("sources"))
        # File order reads best: a typo'd [limts] sits beside [limits] errors.
        order = {key: index for index, key in enumerate(data)}
        problems.sort(key=lambda problem: order.get(re.split(r"[.\[]", problem[0])[0], len(order)))
        errors = [{"file": source, "key": key, "message": message} for key, message in problems]
        home = _home_from(env)
        store_url = env.get("TETHER_STORE_URL") or None
        if store_url is not None and backend_for(store_url) is None:
            message = f"{expected_url()} (got {_redact_url(store_url)!r})"
            errors.append({"env": "TETHER_STORE_URL", "message": message})
        if errors or config is None:
            raise ConfigError(
                "\n".join(
                    f"{error['file']}: {error['key']}: {error['message']}"
                    if "file" in error
                    else f"{error['env']}: {error['message']}"
                    for error in errors
                ),
                details={"file": source, "errors": errors},
            )

        if store_url is None and "url" not in config.store.model_fields_set:
            store_url = f"sqlite:///{home / 'tether.db'}"
        server = config.server
        if env.get("TETHER_TOKEN"):
            server = server.model_copy(update={"token": env["TETHER_TOKEN"]})
        config = config.model_copy(
            update={
                "store": config.store.model_copy(update={"url": store_url or config.store.url}),
                "server": server,
                "sources": [s.resolved(base_dir or Path.cwd()) for s in config.sources],
            }
        )
        config._home = home
        config._secret = env.get("TETHER_SECRET") or None
        return config

    def to_dict(self) -> dict[str, Any]:
        """The config in force as JSON, for recording with a run. Secrets are
        redacted: tokens, MCP env and header values, a store URL's password."""
        out = self.model_dump(mode="json")
        out["home"] = str(self.home)
        out["store"]["url"] = _redact_url(self.store.url)
        if out["server"]["token"] is not None:
            out["server"]["token"] = _REDACTED
        for source in out["sources"]:
            for table in ("env", "headers"):
                if table in source:
                    source[table] = {key: _REDACTED for key in source[table]}
        return out


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Config:
    """Load ``path``; with None, ``$TETHER_CONFIG`` if set, else ``./tether.toml`` if it exists, else defaults.

    ``env`` replaces ``os.environ`` (for tests). Raises ConfigError listing
    every problem found.
    """
    if path is None:
        path = (os.environ if env is None else env).get("TETHER_CONFIG") or None
    if path is None:
        if not Path(DEFAULT_FILE).is_file():
            return Config.from_dict({}, source="<defaults>", env=env)
        path = DEFAULT_FILE
    file = Path(path)
    name = str(path)
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        # There is no key to fix: say where the path came from and how to do without it.
        raise ConfigError(f"{name}: file not found", details={"file": name},
                          next_action="Check the path given with --config or $TETHER_CONFIG, or leave both unset to "
                                      "use ./tether.toml if there is one, else the defaults.") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{name}: not UTF-8 text (bad byte at offset {exc.start})", details={"file": name}
        ) from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read ({exc.strerror})", details={"file": name}) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, column = _error_position(str(exc), text)
        reason = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)$", "", str(exc))
        raise ConfigError(
            f"{name}: invalid TOML at line {line}, column {column}: {reason}",
            details={"file": name, "line": line, "column": column},
        ) from None
    config = Config.from_dict(data, source=name, base_dir=file.resolve().parent, env=env)
    config._path = file.resolve()
    return config


# --- helpers -----------------------------------------------------------------


def _home_from(env: Mapping[str, str]) -> Path:
    return Path(env.get("TETHER_HOME") or DEFAULT_HOME).expanduser().resolve()


def _error_position(message: str, text: str) -> tuple[int, int]:
    found = re.search(r"at line (\d+), column (\d+)", message)
    if found:
        return int(found.group(1)), int(found.group(2))
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", f":{_REDACTED}@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _duplicate_namespaces(sources: Any) -> list[tuple[str, str]]:
    # Read from the raw data so a duplicate is reported alongside every other
    # problem, not only once the rest of the file is valid.
    seen: dict[str, int] = {}
    problems: list[tuple[str, str]] = []
    for index, source in enumerate(sources if isinstance(sources, list) else []):
        namespace = source.get("namespace") if isinstance(source, dict) else None
        if not isinstance(namespace, str):
            continue
        if namespace in seen:
            problems.append(
                (
                    f"sources[{index}].namespace",
                    f"namespace {namespace!r} is already used by sources[{seen[namespace]}]; "
                    "namespaces must be unique",
                )
            )
        else:
            seen[namespace] = index
    return problems


# --- pydantic errors -> one line per bad key ---------------------------------


def _describe_errors(exc: ValidationError) -> list[tuple[str, str]]:
    found: dict[tuple[str, str], None] = {}
    for error in exc.errors():
        path, field, holder = _walk(error["loc"])
        if error["type"] == "union_tag_invalid":
            path += ".type"
        elif error["type"] == "tether" and "key" in error.get("ctx", {}):
            # A cross-key check names the key it blames; pydantic cannot.
            path += f".{error['ctx']['key']}"
        secret = path.endswith(".token") or ".env." in path or ".headers." in path
        if path == "store.url" and isinstance(error.get("input"), str):
            error = {**error, "input": _redact_url(error["input"])}
        # A union member can fail the same way twice; say it once.
        found[(path or "(top level)", _explain(error, field, holder, secret=secret))] = None
    return list(found)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional down to the type that holds the value."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, UnionType) and type(None) in get_args(tp):
            rest = [arg for arg in get_args(tp) if arg is not type(None)]
            tp = rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007
        else:
            return tp


def _table_fields(tp: Any) -> dict[str, FieldInfo] | None:
    """The keys of a table type: a config section (a model) or an engine value object (Limits, Policy, Rule)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.model_fields
    if isinstance(tp, type) and hasattr(tp, "__pydantic_config__") and dataclasses.is_dataclass(tp):
        return checked_fields(tp)
    return None


def _walk(loc: tuple[int | str, ...]) -> tuple[str, FieldInfo | None, type | None]:
    """Turn a pydantic location into a TOML path, plus the FieldInfo of the
    last key named and the model holding it (for unknown-key suggestions)."""
    tp: Any = Config
    field: FieldInfo | None = None
    holder: type | None = None
    path = ""
    for part in loc:
        tp = _unwrap(tp)
        if (fields := _table_fields(tp)) is not None:
            holder, field = tp, fields.get(str(part))
            tp = field.annotation if field is not None else None
            path += f".{part}" if path else str(part)
        elif get_origin(tp) in (Union, UnionType):
            # A tagged union puts the tag in the location; it is not a key.
            tp = next((arg for arg in get_args(tp) if part in _tags(arg)), None)
        elif get_origin(tp) in (list, tuple):
            tp = get_args(tp)[0]
            path += f"[{part}]"
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
            path += f".{part}" if re.fullmatch(r"[A-Za-z0-9_-]+", str(part)) else f".{str(part)!r}"
        else:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path, field, holder


def _tags(model: Any) -> tuple[Any, ...]:
    model = _unwrap(model)
    if isinstance(model, type) and issubclass(model, BaseModel) and "type" in model.model_fields:
        return get_args(model.model_fields["type"].annotation)
    return ()


def _expected(field: FieldInfo | None) -> str | None:
    """The key's Expected text, or a description derived from its type."""
    if field is None:
        return None
    metadata = list(field.metadata)
    # `Alias | None` keeps the alias's metadata one level down.
    for arg in get_args(field.annotation):
        metadata += getattr(arg, "__metadata__", ())
    for item in metadata:
        if isinstance(item, Expected):
            return item.text
    annotation = _unwrap(field.annotation)
    if get_origin(annotation) is Literal:
        return "must be one of " + ", ".join(repr(value) for value in get_args(annotation))
    if _table_fields(annotation) is not None:
        return "must be a table"
    return None


def _got(value: Any, *, secret: bool = False) -> str:
    if secret and not isinstance(value, (dict, list, bool)):
        # Name the type only: the value may be a credential.
        return f"a value of type {type(value).__name__}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _explain(error: Any, field: FieldInfo | None, holder: type | None, *, secret: bool) -> str:
    kind, loc = error["type"], error["loc"]
    # A dataclass (Limits, Policy) reports an unknown key as an unexpected argument.
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        key = str(loc[-1])
        known = list(_table_fields(holder) or {})
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        if close:
            return f"unknown key {key!r} (did you mean {close[0]!r}?)"
        return f"unknown key {key!r} (expected one of: {', '.join(known)})"
    if kind == "union_tag_not_found":
        union = field.annotation if field is not None and loc[-1] == "auth" else SourceDefinition
        tags = ", ".join(repr(tag) for arg in get_args(_unwrap(union)) for tag in _tags(arg))
        return f"missing key 'type' (expected one of {tags})"
    if kind == "union_tag_invalid":
        return f"must be one of {error['ctx']['expected_tags']} (got {error['ctx']['tag']!r})"
    if kind in ("model_type", "model_attributes_type", "dataclass_type", "dataclass_args_type"):
        return f"must be a table (got {_got(error['input'])})"
    if kind == "tether":
        return str(error["msg"])
    expected = _expected(field)
    if kind == "missing":
        return f"required key missing (it {expected})" if expected else "required key missing"
    if expected is None:
        # Not reached by any key tether defines; keep pydantic's wording
        # rather than claim an expectation we do not know.
        return f"{error['msg']} (got {_got(error['input'], secret=secret)})"
    return f"{expected} (got {_got(error['input'], secret=secret)})"

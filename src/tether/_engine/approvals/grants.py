"""The rights each bearer token carries, from ``[server]`` and the environment.

``TETHER_TOKEN`` (and ``[server] token``) keep working as before for running
programs: each such token gets the rights run, approve and metrics, its own runs only.
Since a principal does not approve its own writes unless ``self_approval`` is
set, a single-token server's writes are approved by the operator (``tether
resume RUN_ID --approve --seq N --as OWNER`` on the store), or by a second, named token (docs/mcp.md
"Migrating a single-token set-up").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tether._engine.approvals.rights import ANY, APPROVE, METRICS, RUN, SIGNED_IN, Access, Grant
from tether.errors import ConfigError, TokenRequired

ENV_NAME = "TETHER_TOKEN"
# What a TETHER_TOKEN may do: run, approve (others' runs only where approves_for or self_approval says),
# and scrape /metrics, as the one token of a single-token server always could.
ENV_RIGHTS = frozenset({RUN, APPROVE, METRICS})


def env_token_name(index: int, count: int) -> str:
    return ENV_NAME if count == 1 else f"{ENV_NAME} #{index + 1}"


def server_access(server: Any, env_tokens: Sequence[str], env: Mapping[str, str],
                  principal_of: Callable[[str], str], *, http: bool,
                  oauth: bool = False) -> tuple[Access, tuple[str, ...]]:
    """The Access of a server and every token it accepts, from its ``[server]`` section.

    ``http`` without any token is ``--dev`` on loopback; standard input/output
    has no tokens either: both tell nobody apart (Access.open).
    """
    tables = list(getattr(server, "tokens", None) or [])
    local_runs = getattr(server, "local_runs", "private")
    links = getattr(server, "links", SIGNED_IN)
    configured = getattr(server, "self_approval", None)
    if not http:
        # Standard input/output: one person's own client; tokens play no part (D-31).
        return Access(Access.open().grants, self_approval=True if configured is None else bool(configured),
                      links=links, local_runs=local_runs), ()
    named: list[tuple[str, str, frozenset[str], list[str]]] = []
    for table in tables:
        value = (env.get(table.token_env) or "").strip()
        if not value:
            raise TokenRequired(f"[[server.tokens]] {table.name!r} takes its token from ${table.token_env}, which is "
                                "not set; nothing was started",
                                next_action=f"Set {table.token_env} (e.g. `openssl rand -hex 32`), or remove the "
                                            "table.")
        named.append((table.name, value, frozenset(table.rights), list(table.approves_for)))
    env_named: list[tuple[str, str, frozenset[str], list[str]]] = [(env_token_name(i, len(env_tokens)), t, ENV_RIGHTS, [])
                 for i, t in enumerate(env_tokens)]
    everyone = env_named + named
    tokens = tuple(t for _, t, _, _ in everyone)
    if len(set(tokens)) != len(tokens):
        raise ConfigError("two configured tokens are the same token, so their rights cannot be told apart; "
                          "nothing was started",
                          next_action="Give each [[server.tokens]] entry (and TETHER_TOKEN) its own token.")
    if not everyone and oauth:
        # Only the identity provider's users: their rights come with their tokens and sign-ins.
        return Access.of([], self_approval=bool(configured), links=links, local_runs=local_runs), ()
    if not everyone:
        # --dev on loopback: nobody is told apart, as on standard input/output (D-31).
        self_approval = True if configured is None else bool(configured)
        return Access(Access.open().grants, self_approval=self_approval, links=links, local_runs=local_runs), ()
    by_name: dict[str, list[str]] = {}
    for name, token, _, _ in everyone:
        key = ENV_NAME if name.startswith(ENV_NAME) else name
        by_name.setdefault(key, []).append(principal_of(token))
    grants = []
    for name, token, rights, approves_for in everyone:
        targets: set[str] = set()
        for other in approves_for:
            targets.update([ANY] if other == ANY else by_name.get(other, []))
        grants.append(Grant(principal_of(token), name, rights, frozenset(targets)))
    # Unset: a token over HTTP is somebody else's hands (the agent's); see D-31.
    self_approval = bool(configured) if configured is not None else not http
    return Access.of(grants, self_approval=self_approval, links=links, local_runs=local_runs), tokens

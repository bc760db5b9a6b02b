"""Who may decide a paused write, and through what: one pure function for every surface.

Rights (configured per token, ``[[server.tokens]]``):

* **run**: execute programs, see one's own runs, cancel them, decline their writes;
* **approve**: decide writes, of one's own runs (only with ``self_approval``)
  or of the principals the token approves for;
* **metrics**: scrape ``GET /metrics`` (counts across every principal, no runs);
* **operate**: everything, on every principal's runs (as the CLI on the store).

Which right each door needs is :mod:`tether._engine.approvals.doors` (P-44).

The threat this answers (docs/security.md): the agent holds its token, sees
every result and may have a fetch tool. So whoever *ran* a program is not, by
default, someone who may *approve* its writes; the channel a decision arrives
through says how much is known about who took it (:data:`CHANNELS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

RUN, APPROVE, METRICS, OPERATE = "run", "approve", "metrics", "operate"
RIGHTS = (RUN, APPROVE, METRICS, OPERATE)
# Approval-link modes; SIGNED_IN is also what a policy rule's `approver` may require.
SIGNED_IN, CAPABILITY = "signed_in", "capability"
# approves_for: every principal.
ANY = "*"
LOCAL = "local"


class Channel:
    """Through what a decision arrives, from least to most known about who took it."""

    # The agent's own MCP call naming a decision (`resume`): the caller is the run's token.
    RESUME = "resume"
    # The client application's own question to its user (inline elicitation form,
    # input-required answer): it arrives over the agent's session.
    FORM = "form"
    # An approval link page in capability-only mode: whoever holds the link.
    LINK_CAPABILITY = "link_capability"
    # A signed-in approval link page, and the signed-in console.
    LINK = "link"
    CONSOLE = "console"
    # The CLI or Python API on the store: the operator, who holds the store itself.
    OPERATOR = "operator"


CHANNELS = (Channel.RESUME, Channel.FORM, Channel.LINK_CAPABILITY, Channel.LINK, Channel.CONSOLE,
            Channel.OPERATOR)


@dataclass(frozen=True)
class Grant:
    """What one principal may do: its rights, and whose runs it approves for besides its own."""

    principal: str
    name: str
    rights: frozenset[str]
    approves_for: frozenset[str] = field(default_factory=frozenset)  # principals, or ANY

    def can(self, right: str) -> bool:
        return right in self.rights or OPERATE in self.rights


OPERATOR = Grant(LOCAL, "operator", frozenset({OPERATE}))

# What kind of principal a name belongs to, from its principal id (which the store and the verified token
# set), never from the name (which a token's holder or an identity provider's user may choose), D-62.
KINDS = {"token": "token", "oauth": "IdP user", "oauth-client": "IdP client", LOCAL: "local operator"}
# Quotes and what could fake them, or a line break, inside a name: shown as an apostrophe or a space.
_QUOTES = dict.fromkeys(map(ord, "\"“”„‟«»‹›「」"), "'")


def kind_of(principal: str | None) -> str:
    """``token``, ``oauth`` (a person), ``oauth-client`` (a client of the IdP on its own) or ``local``."""
    prefix = (principal or LOCAL).split(":", 1)[0]
    return prefix if prefix in KINDS else "token"


def shown_as(principal: str | None, name: str | None) -> str:
    """How every surface names a principal: its kind, then its name in quotes.

    Two principals of different kinds never read alike whatever names they were given: an IdP user named
    ``pat`` is ``IdP user “pat”``, the token named ``pat`` is ``token “pat”``. Quotes and control
    characters in a name are replaced, so a name cannot close its quote and start another label.
    """
    kind = kind_of(principal)
    if kind == LOCAL:
        return KINDS[LOCAL]
    text = "".join(" " if not c.isprintable() else c for c in (name or principal or "")).translate(_QUOTES)
    return f"{KINDS[kind]} “{' '.join(text.split())[:120]}”"


@dataclass(frozen=True)
class Access:
    """The rights of every principal a server knows, and the two settings that widen them."""

    grants: Mapping[str, Grant]
    # The principal that ran a program may approve its writes (explicit; see docs/security.md).
    self_approval: bool = False
    # How an approval link decides: SIGNED_IN (a console session) or CAPABILITY (holding the link).
    links: str = SIGNED_IN
    # [server] local_runs: "shared" lets every principal act on runs started without a token.
    local_runs: str = "private"

    def grant(self, principal: str | None) -> Grant | None:
        return self.grants.get(principal) if principal is not None else None

    @classmethod
    def open(cls, *, local_runs: str = "private") -> "Access":
        """Standard input/output and ``--dev``: nobody is told apart, everyone is ``local``."""
        return cls({LOCAL: Grant(LOCAL, LOCAL, frozenset({RUN, APPROVE}))}, self_approval=True,
                   local_runs=local_runs)

    @classmethod
    def of(cls, grants: Iterable[Grant], *, self_approval: bool = False, links: str = SIGNED_IN,
           local_runs: str = "private") -> "Access":
        return cls({g.principal: g for g in grants}, self_approval=self_approval, links=links,
                   local_runs=local_runs)


@dataclass(frozen=True)
class Verdict:
    """May this decision be taken: ``ok``, or the error code and why not (nothing was decided)."""

    ok: bool
    code: str | None = None
    message: str = ""


ALLOWED = Verdict(True)


def may_see(access: Access, grant: Grant | None, owner: str | None) -> bool:
    """Whether ``grant`` may see (and act on) a run owned by ``owner``; otherwise the run does not exist for it."""
    if grant is None:
        return False
    owner = owner or LOCAL
    if OPERATE in grant.rights or owner == grant.principal:
        return True
    if owner == LOCAL:
        # The operator's own runs (CLI, Python API): shared by local_runs, never by "*" (a token's, or an
        # approver's from the identity provider), D-61. Only the operator's own code names `local` itself
        # in approves_for (an in-process framework host naming its approver): no token name and no
        # identity provider's grant can.
        return access.local_runs == "shared" or (APPROVE in grant.rights and LOCAL in grant.approves_for)
    return APPROVE in grant.rights and (ANY in grant.approves_for or owner in grant.approves_for)


def visible_owners(access: Access, grant: Grant | None) -> frozenset[str] | None:
    """The owners whose runs ``grant`` may see, for a store query; None when it sees every run.

    The same rule as :func:`may_see`, written as a filter so a list is cut in SQL, not after a
    limit (another principal's newest runs must not crowd out this one's).
    """
    if grant is None:
        return frozenset()
    if OPERATE in grant.rights or (APPROVE in grant.rights and ANY in grant.approves_for):
        return None  # every owner; local's runs too only where sees_local says so
    owners = {grant.principal}
    if access.local_runs == "shared":
        owners.add(LOCAL)
    if APPROVE in grant.rights:
        owners |= grant.approves_for
    return frozenset(owners)


def sees_local(access: Access, grant: Grant | None) -> bool:
    """Whether ``grant`` sees the runs of ``local`` (the operator's: CLI, Python API, stdio)."""
    return may_see(access, grant, LOCAL)


def may_decide(access: Access, grant: Grant | None, owner: str | None, decision: str, channel: str, *,
               signed_in_required: bool = False) -> Verdict:
    """May ``grant`` take ``decision`` on a write of a run owned by ``owner``, arriving through ``channel``?

    Declining and cancelling only stop things, so whoever may see the run may
    do them; approving sends a write, so it needs a channel that knows a
    person took it, the approve right, and someone other than the run's own
    principal unless ``self_approval`` says otherwise.
    """
    if channel == Channel.OPERATOR:
        return ALLOWED
    if channel == Channel.LINK_CAPABILITY:
        if access.links != CAPABILITY:
            return Verdict(False, "sign_in_required", "deciding on an approval link needs a signed-in approver")
        if decision == "approve" and signed_in_required:
            return Verdict(False, "approval_elsewhere", "the policy requires a signed-in approver for this tool")
        if decision == "decline_and_undo":  # a link decides its one write; an undo acts on the whole run
            return Verdict(False, "sign_in_required", "undoing a run's writes needs a signed-in approver")
        return ALLOWED
    if not may_see(access, grant, owner):
        return Verdict(False, "run_not_found", "there is no such run for you")
    assert grant is not None  # may_see says so
    if decision != "approve" and decision != "decline_and_undo":  # an undo sends writes too (D-68)
        return ALLOWED
    if signed_in_required and channel in (Channel.RESUME, Channel.FORM):
        return Verdict(False, "approval_elsewhere", "the policy requires a signed-in approver for this tool")
    if channel == Channel.FORM:
        # The client application's question to its user: kept (docs/security.md says what it trusts).
        return ALLOWED
    own = (owner or LOCAL) == grant.principal
    if channel == Channel.RESUME:
        if own and access.self_approval and grant.can(APPROVE):
            return ALLOWED
        return Verdict(False, "approval_elsewhere", "the principal that ran a program does not approve its "
                       "writes through resume")
    if not grant.can(APPROVE):
        return Verdict(False, "not_an_approver", f"{grant.name} may run programs but not approve writes")
    if own and not access.self_approval:
        return Verdict(False, "self_approval", f"{grant.name} ran this program, and the principal that ran a "
                       "program does not approve its own writes")
    return ALLOWED


def needs_signed_in(rules: Iterable[Mapping[str, object]], address: str) -> bool:
    """Whether the first policy rule matching ``address`` requires a signed-in approver.

    ``rules`` are a run's recorded (signed) policy rules, so a decision on a
    paused run is checked against the rules it ran under.
    """
    import fnmatch

    for rule in rules:
        match = rule.get("match")
        if isinstance(match, str) and fnmatch.fnmatchcase(address, match):
            return rule.get("approver") == SIGNED_IN
    return False

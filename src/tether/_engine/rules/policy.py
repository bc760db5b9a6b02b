"""May this call run? A pure decision, shared by every backend (P-2).

:class:`Policy` and :class:`Rule` are declared once: ``[policy]`` in tether.toml parses straight into a
:class:`PolicyConfig` (a Policy plus the keys of that table that are not recorded on a run), and a Python
caller builds a Policy checked by the same field types (``__post_init__``: by hand, then by pydantic when that
fails, tether._fields.recheck).
"""

# No `from __future__ import annotations`: the fields' types are objects, not names, so pydantic checks
# this class wherever it is used without looking names up in its module (which reads `tether` once
# tether/__init__.py renames __module__).

import dataclasses
import fnmatch
from typing import Annotated, Any, Literal

from tether._fields import Expected, Glob, PositiveInt, Seconds, positive_int, recheck, seconds

ALLOW = "allow"
ASK = "ask"
DENY = "deny"
# A write goes out without a person unless lineage says a destination derives from untrusted data (P-45, D-64).
GUARD = "guard"
OVER_BUDGET = "over_budget"
ACTIONS = (ALLOW, ASK, DENY)
MODES = (ALLOW, GUARD, ASK, DENY)
# How far back the results of this principal's earlier runs are remembered for a guarded write (D-65): a
# day covers the conversations an agent host keeps open; a longer one makes more writes ask.
LINEAGE_WINDOW_SECONDS = 86400.0
APPROVERS = ("any", "signed_in")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One policy rule; the first rule whose glob matches a tool address wins."""

    # How pydantic checks this class as a table (the config's model) or in recheck(): unknown keys refused.
    __pydantic_config__ = {"extra": "forbid"}

    match: Glob  # a glob over "namespace.tool"
    action: Literal["allow", "ask", "deny"]
    # "signed_in": the tool's writes are decided only by a signed-in approver
    # (the console, a signed-in link page) or the operator, never by an MCP
    # client's approval form (money, deletes, pushes: docs/security.md).
    approver: Literal["any", "signed_in"] = "any"

    def __post_init__(self) -> None:
        # Glob's check (tether._fields) by hand: "*" or a dotted "namespace.tool" pattern.
        if not (type(self.match) is str and (self.match == "*" or "." in self.match)
                and type(self.action) is str and self.action in ACTIONS
                and type(self.approver) is str and self.approver in APPROVERS):
            recheck(self)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What happens to writes. Reads (tools annotated read-only) always run."""

    __pydantic_config__ = {"extra": "forbid"}

    # An unannotated tool counts as a write, so the safe default is a human
    # in the loop; trusted setups say "allow" explicitly.
    writes: Literal["ask", "allow", "guard", "deny"] = "ask"
    # More than 10 writes in one run is usually a loop gone wrong (agents were
    # seen re-sending one billable write 9 times after a truncated result).
    write_budget: PositiveInt = 10
    rules: Annotated[
        tuple[Rule, ...], Expected('must be a list of tables like {match = "helpdesk.*", action = "ask"}')
    ] = ()
    # Under "guard": destination values (or globs over them, such as "*@example.com") a write may name
    # without a person, whatever their lineage (D-64).
    allowlist: Annotated[tuple[str, ...], Expected("must be a list of strings (destination values or globs)")] = ()
    # Under "guard": how long the untrusted results a principal's runs were given count against its later
    # runs' writes; runs of the same REPL session count whatever their age (D-65).
    lineage_window_seconds: Seconds = LINEAGE_WINDOW_SECONDS

    def __post_init__(self) -> None:
        # A list of rules, or rules as tables, goes to pydantic, which makes them a tuple of Rule.
        if not (type(self.writes) is str and self.writes in MODES and positive_int(self.write_budget)
                and type(self.rules) is tuple and all(type(r) is Rule for r in self.rules)
                and type(self.allowlist) is tuple and all(type(a) is str and a for a in self.allowlist)
                and seconds(self, "lineage_window_seconds")):
            recheck(self)

    def to_dict(self) -> dict[str, Any]:
        """The policy as a run records it (signed, P-35): these three keys, and the guard settings only when set
        (a run recorded before they existed keeps its signature), whatever the subclass."""
        return {
            "writes": self.writes,
            "write_budget": self.write_budget,
            # `approver` only when set: a run recorded before it existed keeps its signature.
            "rules": [{"match": r.match, "action": r.action, **({"approver": r.approver} if r.approver != "any" else {})}
                      for r in self.rules],
            **({"allowlist": list(self.allowlist)} if self.allowlist else {}),
            **({"lineage_window_seconds": self.lineage_window_seconds}
               if self.lineage_window_seconds != LINEAGE_WINDOW_SECONDS else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Policy":
        return cls(
            writes=data.get("writes", ASK),
            write_budget=int(data.get("write_budget", 10)),
            rules=tuple(Rule(r["match"], r["action"], r.get("approver", "any")) for r in data.get("rules", ())),
            allowlist=tuple(data.get("allowlist", ())),
            lineage_window_seconds=float(data.get("lineage_window_seconds", LINEAGE_WINDOW_SECONDS)),
        )

    def recorded(self) -> "Policy":
        """Only the policy, without what a subclass adds (PolicyConfig's timings): what a Runtime runs with."""
        return Policy(self.writes, self.write_budget, self.rules, self.allowlist, self.lineage_window_seconds)


@dataclasses.dataclass(frozen=True)
class PolicyConfig(Policy):
    """``[policy]`` as tether.toml writes it: the Policy, plus how long a pause waits and how often a run
    checkpoints (Runtime arguments of their own, never recorded with the policy)."""

    # A day for a human to answer; after that the data the run read is stale.
    approval_ttl_seconds: Seconds = 86400
    # A snapshot costs a few KB and milliseconds; these bound what recovery
    # replays to 100 calls or 30 s of work.
    checkpoint_every_calls: PositiveInt = 100
    checkpoint_every_seconds: Seconds = 30

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (seconds(self, "approval_ttl_seconds") and positive_int(self.checkpoint_every_calls)
                and seconds(self, "checkpoint_every_seconds")):
            recheck(self)


def rule_action(policy: Policy, address: str) -> str:
    """The first matching rule's action, else the default for writes."""
    for rule in policy.rules:
        if fnmatch.fnmatchcase(address, rule.match):
            return rule.action
    return policy.writes


def rule_approver(policy: Policy, address: str) -> str:
    """Who may decide a write to ``address``: the first matching rule's ``approver`` ("any" without one)."""
    for rule in policy.rules:
        if fnmatch.fnmatchcase(address, rule.match):
            return rule.approver
    return "any"


def decide_call(policy: Policy, address: str, is_write: bool, writes_spent: int) -> str:
    """allow / ask / guard / deny / over_budget for one call.

    A rule can deny a read too (an operator may fence off a namespace), but
    only writes ask and spend budget. ``guard`` (only ever the mode's default, never a rule's action): the
    write's lineage decides between allow and ask (tether._engine.lineage.guard, P-45).
    """
    action = rule_action(policy, address)
    if not is_write:
        explicit = any(fnmatch.fnmatchcase(address, r.match) for r in policy.rules)
        return DENY if explicit and action == DENY else ALLOW
    if action == DENY:
        return DENY
    if writes_spent >= policy.write_budget:
        return OVER_BUDGET
    return action

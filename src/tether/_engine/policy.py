"""May this call run? A pure decision, shared by every backend (P-2)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

ALLOW = "allow"
ASK = "ask"
DENY = "deny"
OVER_BUDGET = "over_budget"
ACTIONS = (ALLOW, ASK, DENY)


@dataclass(frozen=True)
class Rule:
    match: str  # a glob over "namespace.tool"
    action: str
    # "signed_in": only a signed-in approver (console, signed-in link page) decides
    # this tool's writes; "any" also lets the client's own approval form decide.
    approver: str = "any"


@dataclass(frozen=True)
class Policy:
    """What happens to writes. Reads (tools annotated read-only) always run."""

    writes: str = ASK
    write_budget: int = 10
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "writes": self.writes,
            "write_budget": self.write_budget,
            # `approver` only when set: a run recorded before it existed keeps its signature.
            "rules": [{"match": r.match, "action": r.action, **({"approver": r.approver} if r.approver != "any" else {})}
                      for r in self.rules],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Policy":
        return cls(
            writes=data.get("writes", ASK),
            write_budget=int(data.get("write_budget", 10)),
            rules=tuple(Rule(r["match"], r["action"], r.get("approver", "any")) for r in data.get("rules", ())),
        )


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
    """allow / ask / deny / over_budget for one call.

    A rule can deny a read too (an operator may fence off a namespace), but
    only writes ask and spend budget.
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

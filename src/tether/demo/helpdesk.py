"""A small help desk, in memory: the tools tether's demos and tests call.

Twelve customers, forty tickets and sixty comments, generated from a seed so
every instance starts from the same data. Each :class:`HelpDesk` owns its
state, so a runtime or a test that builds its own gets a clean desk::

    desk = HelpDesk()
    runtime.add_tools(desk.tools())      # or make_helpdesk()

The module also exposes one default desk's tools at module level, which is
what ``--tools tether.demo.helpdesk`` loads.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

# Pydantic builds the output schemas from these, and on Python < 3.12 it
# accepts only typing_extensions.TypedDict.
from typing_extensions import TypedDict

from tether._sources.python import tool
from tether._tools.model import Tool

__all__ = [
    "AGENTS",
    "FIXTURE_NOW",
    "TETHER_NAMESPACE",
    "Comment",
    "Customer",
    "HelpDesk",
    "Ticket",
    "TicketStats",
    "TicketSummary",
    "default_desk",
    "make_helpdesk",
]

TETHER_NAMESPACE = "helpdesk"

# The fixture's "today": dates are relative to it so the data never ages.
FIXTURE_NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
# Chosen so every customer has tickets and a few urgent ones are still open,
# which is what the demo program's reduce step has something to say about.
DEFAULT_SEED = 34

Status = Literal["open", "pending", "closed"]
Priority = Literal["low", "normal", "high", "urgent"]
Plan = Literal["free", "pro", "enterprise"]
Agent = Literal["ana", "ben", "chloe", "dev"]

STATUSES: tuple[str, ...] = get_args(Status)
PRIORITIES: tuple[str, ...] = get_args(Priority)
AGENTS: tuple[str, ...] = get_args(Agent)

# Above this a list stops being a page and becomes a dump of the desk.
MAX_LIMIT = 200


class Customer(TypedDict):
    id: str
    name: str
    company: str
    email: str
    plan: Plan
    created_at: str


class TicketSummary(TypedDict):
    id: str
    customer_id: str
    title: str
    status: Status
    priority: Priority
    tags: list[str]
    assignee: str | None
    created_at: str


class Ticket(TypedDict):
    id: str
    customer_id: str
    title: str
    body: str
    status: Status
    priority: Priority
    tags: list[str]
    assignee: str | None
    created_at: str
    updated_at: str
    resolution: str | None
    comment_count: int


class Comment(TypedDict):
    id: int
    ticket_id: str
    author: str
    body: str
    internal: bool
    created_at: str


class TicketStats(TypedDict):
    total: int
    by_status: dict[str, int]
    by_priority: dict[str, int]
    open_unassigned: int
    oldest_open_created_at: str | None


# --- fixture -----------------------------------------------------------------

# (id, name, company, email, plan, customer since)
_CUSTOMERS = [
    ("C001", "Ada Okafor", "Brightline Logistics", "ada@brightline.example", "enterprise", "2022-03-14"),
    ("C002", "Tomas Ruiz", "Ruiz & Sons Bakery", "tomas@ruizbakery.example", "free", "2024-11-02"),
    ("C003", "Mei Lin", "Lumen Analytics", "mei.lin@lumen.example", "pro", "2023-06-21"),
    ("C004", "Jonas Berg", "Fjord Outfitters", "jonas@fjord.example", "pro", "2023-01-09"),
    ("C005", "Priya Natarajan", "Kestrel Health", "priya@kestrelhealth.example", "enterprise", "2021-09-30"),
    ("C006", "Sam Whitfield", "Whitfield Legal", "sam@whitfieldlegal.example", "free", "2025-02-17"),
    ("C007", "Amara Diallo", "Baobab Travel", "amara@baobab.example", "pro", "2023-10-05"),
    ("C008", "Lukas Novak", "Novak Print Works", "lukas@novakprint.example", "free", "2024-07-28"),
    ("C009", "Hannah Schultz", "Alpine Dental Group", "hannah@alpinedental.example", "pro", "2022-12-12"),
    ("C010", "Diego Fernandez", "Solano Energy", "diego@solano.example", "enterprise", "2021-04-19"),
    ("C011", "Grace Kim", "Paper Crane Studio", "grace@papercrane.example", "free", "2024-03-03"),
    ("C012", "Oliver Grant", "Grant & Moss Architects", "oliver@grantmoss.example", "pro", "2022-08-25"),
]

# (title, body, tags)
_TICKETS = [
    ("Cannot log in after password reset", "The reset email arrived but the new password is rejected.", ["login"]),
    ("Invoice shows the wrong VAT number", "Our May invoice lists an old VAT number.", ["billing", "invoice"]),
    ("Export to CSV times out", "Exporting more than 10k rows spins forever.", ["export", "performance"]),
    ("Add a second admin to our account", "We need Jo from finance as an admin.", ["account"]),
    ("Webhook deliveries failing with 502", "Since Tuesday every webhook to our endpoint fails.", ["webhooks", "api"]),
    ("Charged twice this month", "Two identical charges appeared on our card.", ["billing", "refund"]),
    ("Dashboard loads very slowly", "The main dashboard takes 20 seconds to load.", ["performance"]),
    ("Two-factor codes not arriving", "SMS codes never arrive on UK numbers.", ["login", "2fa"]),
    ("API rate limit too low for nightly sync", "Our nightly sync hits 429s after ten minutes.", ["api"]),
    ("Request: dark mode", "Several of our staff asked for a dark theme.", ["feature-request"]),
    ("Cancel our subscription", "We are closing the shop at the end of the month.", ["account", "billing"]),
    ("Mobile app crashes on startup", "Android 14, crashes right after the splash screen.", ["mobile", "bug"]),
    ("Wrong time zone on reports", "Reports show UTC instead of Europe/Berlin.", ["reports", "bug"]),
    ("Single sign-on setup with Okta", "Need help configuring SAML with Okta.", ["sso", "login"]),
    ("Data missing from last week's report", "Tuesday and Wednesday are blank.", ["reports", "data"]),
    ("Update billing address", "We moved offices; new address attached.", ["billing"]),
    ("Bulk import rejects valid emails", "Addresses with a plus sign are flagged invalid.", ["import", "bug"]),
    ("Need a signed DPA", "Legal needs a countersigned data processing agreement.", ["legal"]),
    ("Search returns no results for accents", "Searching for 'Muller' misses 'Mueller'.", ["search", "bug"]),
    ("Upgrade from Pro to Enterprise", "Please quote Enterprise for 120 seats.", ["sales", "billing"]),
    ("Email notifications go to spam", "Gmail marks every notification as spam.", ["email"]),
    ("Audit log export for compliance", "Auditors need the last 12 months of logs.", ["compliance", "export"]),
    ("Broken link in welcome email", "The 'get started' link is a 404.", ["email", "bug"]),
    ("Users locked out after SSO change", "After rotating the certificate nobody can log in.", ["sso", "login"]),
    ("Refund for unused seats", "We over-bought 15 seats in March.", ["billing", "refund"]),
    ("Calendar sync duplicates events", "Every event appears twice in Outlook.", ["integrations", "bug"]),
    ("How do I rotate API keys?", "Docs mention rotation but not the steps.", ["api", "question"]),
    ("PDF invoices are blank", "Downloaded invoices open as an empty page.", ["billing", "invoice", "bug"]),
    ("Slack integration stopped posting", "No messages in #support since Friday.", ["integrations"]),
    ("Request: custom fields on tickets", "We want a 'site' field on every ticket.", ["feature-request"]),
    ("Password policy too strict", "Staff cannot use passphrases with spaces.", ["login"]),
    ("GDPR deletion request for a user", "A former employee asked for erasure.", ["legal", "privacy"]),
    ("Attachments over 5 MB fail", "Uploads stop at 99% for larger files.", ["attachments", "bug"]),
    ("Report scheduling skips Mondays", "Weekly report never sends on Mondays.", ["reports", "bug"]),
    ("Onboarding call for new team", "Twelve new agents start next week.", ["onboarding"]),
    ("Outage on May 28?", "Was there an incident around 14:00 UTC?", ["incident", "question"]),
    ("Duplicate customer records after import", "The import created 300 duplicates.", ["import", "data"]),
    ("Change account owner", "Ownership should move to our new CTO.", ["account"]),
    ("Tax exemption certificate", "Attaching our exemption certificate for 2025.", ["billing", "legal"]),
    ("API returns 500 on pagination", "Page 3 of /orders always returns 500.", ["api", "bug"]),
]

_AGENT_REPLIES = [
    "Thanks for the report, I can reproduce this and have raised it with engineering.",
    "Could you send a screenshot and the time it happened?",
    "We pushed a fix this morning; can you confirm it works for you?",
    "I've escalated this to the billing team.",
    "This is expected behaviour on your plan; here are the options.",
    "Following up: did the workaround help?",
]
_INTERNAL_NOTES = [
    "Looks related to last week's deploy.",
    "Customer is on a renewal call next week, handle with care.",
    "Engineering ticket ENG-4121 filed.",
    "Checked the logs: requests never reach us.",
]
_CUSTOMER_REPLIES = [
    "Still happening today, unfortunately.",
    "Screenshot attached.",
    "That fixed it, thank you!",
    "Any update on this?",
    "We need this resolved before Friday.",
]
_RESOLUTIONS = [
    "Fixed in release 4.12.",
    "Refund issued.",
    "Answered the question; no change needed.",
    "Configuration corrected on the customer's side.",
    "Duplicate of an existing ticket.",
]


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _build_fixture(seed: int) -> tuple[dict[str, Customer], dict[str, dict[str, Any]], list[Comment]]:
    rng = random.Random(seed)
    customers: dict[str, Customer] = {
        cid: Customer(id=cid, name=name, company=company, email=email, plan=plan, created_at=f"{since}T00:00:00Z")  # type: ignore[typeddict-item]
        for cid, name, company, email, plan, since in _CUSTOMERS
    }
    # Creation times are drawn first and sorted, so ticket ids rise with age.
    starts = sorted(FIXTURE_NOW - timedelta(days=rng.uniform(1, 90)) for _ in _TICKETS)
    tickets: dict[str, dict[str, Any]] = {}
    for number, ((title, body, tags), created) in enumerate(zip(_TICKETS, starts, strict=True), start=1001):
        created = created.replace(second=0, microsecond=0)
        status = rng.choices(STATUSES, weights=(45, 20, 35))[0]
        assignee = None if status == "open" and rng.random() < 0.4 else rng.choice(AGENTS)
        tickets[f"T{number}"] = {
            "id": f"T{number}",
            "customer_id": rng.choice(_CUSTOMERS)[0],
            "title": title,
            "body": body,
            "status": status,
            "priority": rng.choices(PRIORITIES, weights=(20, 45, 25, 10))[0],
            "tags": list(tags),
            "assignee": assignee,
            "created_at": _iso(created),
            "updated_at": _iso(created),
            "resolution": rng.choice(_RESOLUTIONS) if status == "closed" else None,
        }
    comments: list[Comment] = []
    for _ in range(60):
        ticket = tickets[rng.choice(list(tickets))]
        author_kind = rng.random()
        if author_kind < 0.45:
            author, body, internal = ticket["assignee"] or rng.choice(AGENTS), rng.choice(_AGENT_REPLIES), False
        elif author_kind < 0.65:
            author, body, internal = rng.choice(AGENTS), rng.choice(_INTERNAL_NOTES), True
        else:
            author, body, internal = customers[ticket["customer_id"]]["name"], rng.choice(_CUSTOMER_REPLIES), False
        comments.append(
            Comment(id=0, ticket_id=ticket["id"], author=author, body=body, internal=internal, created_at="")
        )
    # Comments on a ticket come after it was opened and before "now", in order.
    by_ticket: dict[str, list[Comment]] = {}
    for comment in comments:
        by_ticket.setdefault(comment["ticket_id"], []).append(comment)
    for ticket_id, thread in by_ticket.items():
        opened = datetime.fromisoformat(tickets[ticket_id]["created_at"].replace("Z", "+00:00"))
        step = (FIXTURE_NOW - opened) / (len(thread) + 1)
        for index, comment in enumerate(thread, start=1):
            comment["created_at"] = _iso((opened + step * index).replace(second=0, microsecond=0))
        tickets[ticket_id]["updated_at"] = thread[-1]["created_at"]
    comments.sort(key=lambda c: (c["created_at"], c["ticket_id"]))
    for number, comment in enumerate(comments, start=1):
        comment["id"] = number
    return customers, tickets, comments


# --- the desk ----------------------------------------------------------------


class HelpDesk:
    """One help desk's state and the tools that read and change it.

    ``clock`` gives the time stamped on writes; the default starts at
    :data:`FIXTURE_NOW` and moves one minute per write, so runs are
    reproducible.
    """

    def __init__(self, *, seed: int = DEFAULT_SEED, clock: Callable[[], datetime] | None = None) -> None:
        self._seed = seed
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Back to the fixture data, as if new; tools already built see the reset."""
        self._customers, self._tickets, self._comments = _build_fixture(self._seed)
        self._writes = 0

    def tools(self) -> list[Tool]:
        """This desk's tools, addressed ``helpdesk.<name>``."""
        return [_as_tool(getattr(self, name)) for name in _TOOLS]

    # -- reads ----------------------------------------------------------------

    async def search_customers(self, query: str = "") -> list[Customer]:
        """Find customers by name, company or email (case-insensitive substring).

        Args:
            query: Text to look for; an empty query lists every customer.
        """
        needle = query.strip().lower()
        return [
            copy.deepcopy(c)
            for c in self._customers.values()
            if not needle or any(needle in c[key].lower() for key in ("name", "company", "email"))
        ]

    async def get_customer(self, customer_id: str) -> Customer:
        """Get one customer: name, company, email, plan and since when.

        Args:
            customer_id: A customer id such as "C001".
        """
        return copy.deepcopy(self._customer(customer_id))

    async def list_tickets(
        self,
        status: Status | None = None,
        customer_id: str | None = None,
        priority: Priority | None = None,
        limit: int = 50,
    ) -> list[TicketSummary]:
        """List tickets, oldest first, filtered by status (open, pending,
        closed), customer and priority. Summaries only: get_ticket has the body.

        Args:
            status: Only tickets with this status.
            customer_id: Only this customer's tickets, e.g. "C001".
            priority: Only tickets with this priority.
            limit: At most this many tickets (1-200).
        """
        _check_choice("status", status, STATUSES, optional=True)
        _check_choice("priority", priority, PRIORITIES, optional=True)
        if customer_id is not None:
            self._customer(customer_id)
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_LIMIT} (got {limit})")
        found = [
            t
            for t in self._tickets.values()
            if (status is None or t["status"] == status)
            and (customer_id is None or t["customer_id"] == customer_id)
            and (priority is None or t["priority"] == priority)
        ]
        return [_summary(t) for t in found[:limit]]

    async def get_ticket(self, ticket_id: str) -> Ticket:
        """Get one ticket with its body, resolution and number of comments.

        Args:
            ticket_id: A ticket id such as "T1001".
        """
        return self._full(self._ticket(ticket_id))

    async def list_comments(self, ticket_id: str) -> list[Comment]:
        """List a ticket's comments, oldest first, internal notes included.

        Args:
            ticket_id: A ticket id such as "T1001".
        """
        self._ticket(ticket_id)
        return [copy.deepcopy(c) for c in self._comments if c["ticket_id"] == ticket_id]

    async def ticket_stats(self) -> TicketStats:
        """Count tickets by status and priority, count open tickets nobody is
        assigned to, and give when the oldest open ticket was created."""
        tickets = list(self._tickets.values())
        open_ = [t for t in tickets if t["status"] == "open"]
        return TicketStats(
            total=len(tickets),
            by_status={s: sum(t["status"] == s for t in tickets) for s in STATUSES},
            by_priority={p: sum(t["priority"] == p for t in tickets) for p in PRIORITIES},
            open_unassigned=sum(t["assignee"] is None for t in open_),
            oldest_open_created_at=min((t["created_at"] for t in open_), default=None),
        )

    # -- writes ---------------------------------------------------------------

    async def create_ticket(self, customer_id: str, title: str, body: str, priority: Priority = "normal") -> Ticket:
        """Open a new ticket for a customer. Each call creates another ticket.

        Args:
            customer_id: The customer the ticket is for, e.g. "C001".
            title: One line saying what is wrong.
            body: The full description.
            priority: How urgent it is.
        """
        self._customer(customer_id)
        _check_choice("priority", priority, PRIORITIES)
        if not title.strip():
            raise ValueError("title must not be empty")
        now = self._stamp()
        ticket_id = f"T{1001 + len(self._tickets)}"
        self._tickets[ticket_id] = {
            "id": ticket_id,
            "customer_id": customer_id,
            "title": title.strip(),
            "body": body,
            "status": "open",
            "priority": priority,
            "tags": [],
            "assignee": None,
            "created_at": now,
            "updated_at": now,
            "resolution": None,
        }
        return self._full(self._tickets[ticket_id])

    async def add_comment(self, ticket_id: str, body: str, internal: bool = False) -> Comment:
        """Add a comment to a ticket, signed by the ticket's assignee.

        Args:
            ticket_id: A ticket id such as "T1001".
            body: The comment text.
            internal: True for a note the customer does not see.
        """
        ticket = self._ticket(ticket_id)
        if not body.strip():
            raise ValueError("body must not be empty")
        now = self._stamp()
        comment = Comment(
            id=len(self._comments) + 1,
            ticket_id=ticket_id,
            author=ticket["assignee"] or "support",
            body=body,
            internal=internal,
            created_at=now,
        )
        self._comments.append(comment)
        ticket["updated_at"] = now
        return copy.deepcopy(comment)

    async def close_ticket(self, ticket_id: str, resolution: str) -> Ticket:
        """Close a ticket with a resolution. Closing a closed ticket is an error.

        Args:
            ticket_id: A ticket id such as "T1001".
            resolution: What was done, shown to the customer.
        """
        ticket = self._ticket(ticket_id)
        if ticket["status"] == "closed":
            raise ValueError(f"ticket {ticket_id} is already closed ({ticket['resolution']})")
        if not resolution.strip():
            raise ValueError("resolution must not be empty")
        ticket.update(status="closed", resolution=resolution.strip(), updated_at=self._stamp())
        return self._full(ticket)

    async def assign_ticket(self, ticket_id: str, agent: Agent) -> Ticket:
        """Assign a ticket to a support agent. Assigning it to the agent who
        already has it changes nothing.

        Args:
            ticket_id: A ticket id such as "T1001".
            agent: The agent's login.
        """
        ticket = self._ticket(ticket_id)
        _check_choice("agent", agent, AGENTS)
        if ticket["assignee"] != agent:
            ticket.update(assignee=agent, updated_at=self._stamp())
        return self._full(ticket)

    # -- helpers --------------------------------------------------------------

    def _customer(self, customer_id: str) -> Customer:
        try:
            return self._customers[customer_id]
        except KeyError:
            raise LookupError(
                f"no customer {customer_id!r}; ids look like 'C001' (search_customers finds them)"
            ) from None

    def _ticket(self, ticket_id: str) -> dict[str, Any]:
        try:
            return self._tickets[ticket_id]
        except KeyError:
            raise LookupError(f"no ticket {ticket_id!r}; ids look like 'T1001' (list_tickets finds them)") from None

    def _full(self, ticket: dict[str, Any]) -> Ticket:
        count = sum(c["ticket_id"] == ticket["id"] for c in self._comments)
        return Ticket(**copy.deepcopy(ticket), comment_count=count)  # type: ignore[typeddict-item]

    def _stamp(self) -> str:
        self._writes += 1
        if self._clock is not None:
            return _iso(self._clock())
        return _iso(FIXTURE_NOW + timedelta(minutes=self._writes))


def _summary(ticket: dict[str, Any]) -> TicketSummary:
    keys = TicketSummary.__annotations__
    return TicketSummary(**{k: copy.deepcopy(ticket[k]) for k in keys})  # type: ignore[typeddict-item]


def _check_choice(name: str, value: Any, allowed: tuple[str, ...], *, optional: bool = False) -> None:
    # The input schema already says this for calls through tether; direct
    # callers (tests, other Python code) get the same answer.
    if (value is None and optional) or value in allowed:
        return
    raise ValueError(f"{name} must be one of {', '.join(allowed)} (got {value!r})")


# How each method is exposed. Reads are read-only; of the writes, closing is
# destructive and assigning is idempotent (the same agent twice is a no-op).
_TOOLS: dict[str, dict[str, Any]] = {
    "search_customers": {"title": "Search customers", "read_only": True},
    "get_customer": {"title": "Get a customer", "read_only": True},
    "list_tickets": {"title": "List tickets", "read_only": True},
    "get_ticket": {"title": "Get a ticket", "read_only": True},
    "list_comments": {"title": "List a ticket's comments", "read_only": True},
    "ticket_stats": {"title": "Ticket statistics", "read_only": True},
    "create_ticket": {"title": "Create a ticket"},
    "add_comment": {"title": "Add a comment"},
    "close_ticket": {"title": "Close a ticket", "destructive": True},
    "assign_ticket": {"title": "Assign a ticket", "idempotent": True},
}


def _as_tool(method: Callable[..., Any]) -> Tool:
    return _expose(method).__tether_tool__.to_tool()  # type: ignore[attr-defined]


def _expose(method: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function calling ``method``, marked with ``@tool``.

    ``@tool`` records the tool by setting an attribute on the function, which
    a bound method refuses; a wrapper per instance keeps each desk's tools
    bound to that desk. ``functools.wraps`` carries the signature (without
    ``self``), docstring and annotations over for the schemas.
    """

    @functools.wraps(method)
    async def call(**kwargs: Any) -> Any:
        return await method(**kwargs)

    return tool(namespace=TETHER_NAMESPACE, **_TOOLS[method.__name__])(call)


def make_helpdesk(*, seed: int = DEFAULT_SEED, clock: Callable[[], datetime] | None = None) -> list[Tool]:
    """The tools of a new desk with fresh fixture data."""
    return HelpDesk(seed=seed, clock=clock).tools()


# --- the default desk, for `--tools tether.demo.helpdesk` ----------------------

# tools_from_module collects these; every runtime loading the module shares
# this one desk (default_desk.reset() starts it over). Use make_helpdesk()
# for a desk of your own.
default_desk = HelpDesk()
search_customers = _expose(default_desk.search_customers)
get_customer = _expose(default_desk.get_customer)
list_tickets = _expose(default_desk.list_tickets)
get_ticket = _expose(default_desk.get_ticket)
list_comments = _expose(default_desk.list_comments)
ticket_stats = _expose(default_desk.ticket_stats)
create_ticket = _expose(default_desk.create_ticket)
add_comment = _expose(default_desk.add_comment)
close_ticket = _expose(default_desk.close_ticket)
assign_ticket = _expose(default_desk.assign_ticket)

"""The demo: an in-memory help desk (:mod:`tether.demo.helpdesk`) and a program
a model might write against it.

``DEMO_PROGRAM`` stays inside the sandbox's Python subset: no class
inheritance, generators, ``del`` or ``asyncio.create_task``, and
``asyncio.gather`` gets positional arguments only. It makes 19 tool calls
(one search, one customer list, twelve ticket lists in parallel, five ticket
reads in parallel), well under the default ``host_calls`` of 50.
"""

from __future__ import annotations

__all__ = ["DEMO_PROGRAM"]

DEMO_PROGRAM = """\
import asyncio
import tools

# Find the tools first rather than guessing their names.
found = await search("list open tickets")
addresses = [hit["address"] for hit in found["results"]]

# Fan out: every customer's open tickets, fetched in parallel.
customers = await tools.helpdesk.search_customers(query="")
pages = await asyncio.gather(
    *[tools.helpdesk.list_tickets(status="open", customer_id=c["id"]) for c in customers]
)

# Reduce here, in the sandbox, so only the answer reaches the model.
open_tickets = [ticket for page in pages for ticket in page]
by_priority = {"urgent": 0, "high": 0, "normal": 0, "low": 0}
for ticket in open_tickets:
    by_priority[ticket["priority"]] += 1
by_customer = {}
names = {c["id"]: c["name"] for c in customers}
for ticket in open_tickets:
    name = names[ticket["customer_id"]]
    by_customer[name] = by_customer.get(name, 0) + 1
busiest = sorted(by_customer.items(), key=lambda item: (-item[1], item[0]))[:3]

oldest = sorted(open_tickets, key=lambda ticket: ticket["created_at"])[:5]
details = await asyncio.gather(
    *[tools.helpdesk.get_ticket(ticket_id=ticket["id"]) for ticket in oldest]
)

{
    "tools_found": addresses[:5],
    "open_tickets": len(open_tickets),
    "by_priority": by_priority,
    "busiest_customers": [{"customer": name, "open": count} for name, count in busiest],
    "oldest_open": [
        {
            "id": t["id"],
            "customer": names[t["customer_id"]],
            "title": t["title"],
            "priority": t["priority"],
            "opened": t["created_at"][:10],
            "assignee": t["assignee"],
            "comments": t["comment_count"],
        }
        for t in details
    ],
}
"""

"""The tools the framework tests' agents call: a read, and a write that records each send to a file.

``DESK_SENT`` names the file: one JSON line per write that reached the tool, so a test counts sends
across processes (the runtime that sent it may have been killed since).
"""

from __future__ import annotations

import json
import os

from tether import tool

# A model's program: reads a ticket, then writes a comment on it (which asks a person first).
PROGRAM = ('import tools\n'
           'ticket = await tools.desk.get_ticket("T1")\n'
           'await tools.desk.add_comment("T1", "On it")\n'
           '{"status": ticket["status"], "commented": True}\n')


@tool(read_only=True, namespace="desk")
def get_ticket(ticket_id: str) -> dict:
    """Get one ticket."""
    return {"id": ticket_id, "status": "open"}


@tool(namespace="desk")
def add_comment(ticket_id: str, body: str) -> dict:
    """Add a comment to a ticket."""
    with open(os.environ["DESK_SENT"], "a") as f:
        f.write(json.dumps({"ticket_id": ticket_id, "body": body}) + "\n")
    return {"ticket_id": ticket_id, "body": body}


TOOLS = [get_ticket, add_comment]


def sent(path: str) -> list[dict]:
    """Every write the tool received, in order."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]

"""The mailbox the user's-words tests use, the frameworks' agents and the engine's own (D-75, D-76): an inbox an attacker writes into (untrusted:
an open-world read) that holds Alice's address as a sender and the attacker's in a body, and a send.

An agent first reads the inbox (one ``execute``), then sends to an address copied into a literal (a later
``execute``), as a model that read the inbox writes it: under ``writes = "guard"`` that send asks, unless the
user's words hold the address.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fixtures import mailbox_tools

from tether import Policy, Runtime

ALICE = "alice@corp.example"  # the sender of the inbox's first mail
ATTACKER = mailbox_tools.ATTACKER  # named in the body of the inbox's second mail
ASKED = f"Please send Alice ({ALICE}) the lunch menu."

# The inbox, returned to the model: the tool's result in the conversation holds both addresses.
READ = "import tools\nawait tools.mail.get_received_emails()\n"


def send(address: str) -> str:
    return f"import tools\nawait tools.mail.send_email(recipients=[{address!r}], subject='menu', body='b')\n'sent'\n"


def send_each(*recipients: str) -> str:
    """A later run's program sending one e-mail to each address, in order, each copied into a literal."""
    return "import tools\n" + "".join(
        f"await tools.mail.send_email(recipients=[{r!r}], subject='s{i}', body='b')\n"
        for i, r in enumerate(recipients)) + "'done'\n"


def guarded(*modules: Any, **kw: Any) -> Runtime:
    """A runtime over the mailbox (and ``modules``) whose writes are judged by their lineage unless ``policy``
    says otherwise (``MAILBOX_SENT`` set by the test)."""
    kw.setdefault("policy", Policy(writes="guard"))
    return Runtime(tools=[mailbox_tools, *modules], type_check=False, **kw)


def sent(path: Path) -> list[list[str]]:
    """The recipients of every e-mail the send tool received, in order."""
    return [json.loads(line)["recipients"] for line in path.read_text().splitlines()] if path.exists() else []


def marks(rt: Runtime, run_id: str) -> list[list[str]] | None:
    """The user's words the run keeps (``meta.user_words``), or None when it keeps none."""
    held = rt.store.get_run(run_id).meta.get("user_words")
    return None if held is None else held["marks"]


def asked_because(rt: Runtime, run_id: str) -> list[str]:
    """What each reason that made the run's writes ask says."""
    return [r["says"] for e in rt.store.get_calls(run_id) if e.kind == "write" for r in e.lineage["reasons"]
            if r["asks"]]

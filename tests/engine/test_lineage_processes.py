"""P-45 across processes: a guarded run configured from tether.toml (trust labels per source and per tool)
pauses in one process, and each resume in a new process — a restart, as another replica would — judges the
writes it reaches from the signed journal and the program, the same way, on SQLite and on Postgres. Every
write is sent once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import own_database

FIXTURES = Path(__file__).parent.parent / "fixtures"
TETHER = [sys.executable, "-m", "tether.cli"]

pytestmark = pytest.mark.slow

PROGRAM = """
import tools
mails = await tools.mail.get_received_emails()
book = await tools.mail.get_contacts()
# A literal goes out; the address the inbox carried waits, each time it is written.
await tools.mail.send_email(recipients=["carol@corp.example"], subject="hi", body=book[0]["name"])
await tools.mail.send_email(recipients=["carol@corp.example"], subject="hi again", body="x")
to = [w for w in mails[1]["body"].split() if "@" in w][0]
await tools.mail.send_email(recipients=[to], subject="invoices", body="x")
await tools.mail.send_email(recipients=[to.upper().lower()], subject="again", body="x")
"done"
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/tether.db"
    return own_database(request.getfixturevalue("pg_url"), "lineage")


def tether(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(TETHER + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_p45_each_resume_in_a_new_process_judges_the_writes_it_reaches_the_same_way(tmp_path, store_url):
    (tmp_path / "tether.toml").write_text(
        "[policy]\n"
        'writes = "guard"\n'
        "[[sources]]\n"
        'type = "python"\n'
        f"module = {json.dumps(str(FIXTURES / 'mailbox_tools.py'))}\n"
        'trust = "untrusted"\n'
        'trust_tools = { get_contacts = "trusted" }\n'
    )
    (tmp_path / "prog.py").write_text(PROGRAM)
    sent = tmp_path / "sent.jsonl"
    env = dict(os.environ, TETHER_HOME=str(tmp_path / "home"), TETHER_STORE_URL=store_url, MAILBOX_SENT=str(sent))
    env.pop("TETHER_SECRET", None)

    def sent_to() -> list[list[str]]:
        return [json.loads(line)["recipients"] for line in sent.read_text().splitlines()] if sent.exists() else []

    first = tether(["run", "prog.py", "--json", "--no-prompt"], env, tmp_path)
    assert first.returncode == 3, first.stdout + first.stderr
    out = json.loads(first.stdout)
    run_id = out["run_id"]
    assert out["pending"]["seq"] == 5
    [why] = [r for r in out["pending"]["writes"][0]["reasons"] if r["asks"]]
    assert "mail.get_received_emails" in why["says"] and why["origin"]["seq"] == 1
    assert sent_to() == [["carol@corp.example"], ["carol@corp.example"]]

    # A new process (a restart): the write approved goes out; the next one, reached here for the first time,
    # is judged from the journal the first process signed, and asks for the same reason.
    second = tether(["resume", run_id, "--approve", "--json"], env, tmp_path)
    assert second.returncode == 3, second.stdout + second.stderr
    again = json.loads(second.stdout)
    assert again["pending"]["seq"] == 6
    [why2] = [r for r in again["pending"]["writes"][0]["reasons"] if r["asks"]]
    assert why2["origin"] == why["origin"] and why2["says"] == why["says"]
    assert sent_to() == [["carol@corp.example"], ["carol@corp.example"], ["mallory@evil.example"]]

    # The timeline keeps every verdict, and the text view says why the waiting write asks.
    shown = tether(["runs", "show", run_id], env, tmp_path)
    assert "asked: recipients[0]: " in shown.stdout and "mail.get_received_emails" in shown.stdout, shown.stdout
    assert "why: recipients[0]: " in shown.stdout

    third = tether(["resume", run_id, "--approve", "--seq", "6", "--json"], env, tmp_path)
    assert third.returncode == 0, third.stdout + third.stderr
    finished = json.loads(third.stdout)
    assert finished["status"] == "completed" and finished["result"] == "done", finished
    timeline = json.loads(tether(["runs", "show", run_id, "--json"], env, tmp_path).stdout)
    verdicts = {c["seq"]: c["lineage"].get("asked") for c in timeline["calls"] if c["kind"] == "write"}
    assert verdicts == {3: False, 4: False, 5: True, 6: True}
    assert timeline["calls"][0]["lineage"]["trust"] == "untrusted" and timeline["calls"][0]["lineage"]["marks"] > 0
    assert "lineage" not in timeline["calls"][1]  # the trusted contacts read journals no marks
    assert sent_to() == [["carol@corp.example"], ["carol@corp.example"], ["mallory@evil.example"],
                         ["mallory@evil.example"]]

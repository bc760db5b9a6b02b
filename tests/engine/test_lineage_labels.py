"""P-45, D-64: trust labels and argument roles from ``[[sources]]``, through a runtime opened from a config as
tether.toml would open it: a trusted tool's values go out, a field marked trusted is not remembered, a role
override makes an argument a destination, and what no label covers is untrusted."""

from __future__ import annotations

import json
from pathlib import Path

from tether._app import open_runtime
from tether._config import Config
from tether._engine.lineage.trust import Labels, labels_from, path_keys

FIXTURES = Path(__file__).parent.parent / "fixtures"
ATTACKER = "mallory@evil.example"


def test_p45_labels_by_source_tool_and_field_and_roles_by_argument():
    labels = labels_from([("mail", {"trust": "trusted", "trust_tools": {"inbox": "untrusted"},
                                    "trust_fields": {"inbox.meta.received": "trusted", "inbox.body": "untrusted"},
                                    "roles": {"send.subject": "destination"}}),
                          (None, {"namespace": "web"})])
    assert labels.of("mail.contacts").label == "trusted" and not labels.of("mail.contacts").untrusted
    inbox = labels.of("mail.inbox")
    assert inbox.untrusted and inbox.label_at("[3].meta.received") == "trusted"
    assert inbox.label_at("[3].body") == inbox.label_at(".meta") == "untrusted"
    assert labels.of("web.fetch").untrusted and labels.of("other.tool").untrusted  # unlabelled: untrusted
    assert labels.roles_of("mail.send") == {"subject": "destination"} and labels.roles_of("mail.inbox") == {}
    assert path_keys("[2]['a.b'].c[0]") == ("a.b", "c") and Labels().of("x.y").label == "untrusted"


async def test_p45_a_trusted_source_and_a_trusted_field_let_their_values_go(tmp_path, monkeypatch):
    sent = tmp_path / "sent.jsonl"
    monkeypatch.setenv("MAILBOX_SENT", str(sent))
    config = Config.from_dict({"policy": {"writes": "guard"}, "sources": [{
        "type": "python", "module": str(FIXTURES / "mailbox_tools.py"),
        "trust_tools": {"get_contacts": "trusted"},
        "trust_fields": {"get_received_emails.sender": "trusted"}}]},
        env={"TETHER_HOME": str(tmp_path / "home")})
    async with open_runtime(config, store_url=f"sqlite:///{tmp_path}/t.db", type_check=False) as rt:
        read = await rt.execute("import tools\nawait tools.mail.get_received_emails()")
        marks = rt.store.get_calls(read.run_id)[0].lineage["marks"]
        assert any(m[1] == ATTACKER for m in marks) and not any(m[2].endswith(".sender") for m in marks)
        # A later run typing the sender (a trusted field) goes out; typing the body's address asks.
        sender = await rt.execute("import tools\nawait tools.mail.send_email(recipients=['news@letters.example'], "
                                  "subject='s', body='b')")
        assert sender.status == "completed", sender.error
        copied = await rt.execute(f"import tools\nawait tools.mail.send_email(recipients=[{ATTACKER!r}], "
                                  "subject='s', body='b')")
        assert copied.status == "paused"
        # The trusted contacts read journals nothing and its value goes out.
        contact = await rt.execute("import tools\nbook = await tools.mail.get_contacts()\n"
                                   "await tools.mail.send_email(recipients=[book[0]['email']], subject='s', body='b')")
        assert contact.status == "completed", contact.error
        assert rt.store.get_calls(contact.run_id)[0].lineage is None
    assert [json.loads(line)["recipients"] for line in sent.read_text().splitlines()] == [
        ["news@letters.example"], ["bob@corp.example"]]


async def test_p45_a_role_override_makes_an_argument_a_destination(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILBOX_SENT", str(tmp_path / "sent.jsonl"))
    program = ("import tools\nm = await tools.mail.get_received_emails()\n"
               "await tools.mail.send_email(recipients=['bob@corp.example'], subject=m[1]['id'], body='b')")
    for roles, status in (({}, "completed"), ({"send_email.subject": "destination"}, "paused")):
        config = Config.from_dict({"policy": {"writes": "guard"}, "sources": [{
            "type": "python", "module": str(FIXTURES / "mailbox_tools.py"), "roles": roles}]},
            env={"TETHER_HOME": str(tmp_path / "home")})
        async with open_runtime(config, store_url=f"sqlite:///{tmp_path}/{status}.db", type_check=False) as rt:
            result = await rt.execute(program)
            assert result.status == status, (roles, result.error)


def test_p45_a_reason_is_shown_escaped_with_secret_arguments_masked_and_bounded():
    from tether._engine.lineage.why import LINES, why_lines, why_text

    # A reason quotes what an untrusted source wrote: a field name can carry a bidi override.
    reasons = [{"arg": "to", "says": 'the e-mail address is in the "bo\u202edy" field of the result of x.y() at call 1',
                "asks": True},
               {"arg": "cc", "says": "typed in the program", "asks": False},
               {"arg": "api_key", "says": "from the result of x.y(): sk-live-0123456789", "asks": True}]
    lines = why_lines(reasons, {"to": "a@b.example", "api_key": "sk-live-0123456789"})
    assert lines[0] == 'to: the e-mail address is in the "bo\\u202edy" field of the result of x.y() at call 1'
    assert len(lines) == 2 and "sk-live-0123456789" not in lines[1]  # only reasons that asked; secrets masked
    assert why_lines([{"arg": "a", "says": "s", "asks": True}] * 50) == ["a: s"] * LINES
    assert why_text([{"arg": "cc", "says": "typed in the program", "asks": False}]) == ""

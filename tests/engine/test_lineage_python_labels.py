"""P-45, D-73: trust labels and argument roles given in Python — ``@tool(trust=..., trust_fields=..., roles=...)``
and ``Tool(trust=...)`` — reach the guard of a ``Runtime(tools=[...], policy=Policy(writes="guard"))``: a
destination a trusted tool returned goes out unasked, the same value from an unlabelled tool asks naming it, a
field labelled apart is judged apart, a role makes an argument a destination or content, a bad label is refused
when the tool is declared, a resume in a fresh Runtime decides the same way, and a ``[[sources]]`` table that
disagrees with a tool's own labels gives way to the stricter of the two.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tether import Annotations, Policy, Runtime, Tool, tool
from tether._engine.lineage.trust import labels_from
from tether._store import open_store
from tether.errors import InvalidToolDefinition

ATTACKER = "mallory@evil.example"
BOB = "bob@corp.example"
CAROL = "carol@corp.example"
GUARD = Policy(writes="guard")


def mailbox(sent: list[dict[str, Any]], *, labelled: bool = True, ref_role: str | None = None,
            account_role: str | None = None) -> list[Any]:
    """A contacts directory (trusted but for the ``forward_to`` field anyone can edit), an inbox (unlabelled),
    a send and two writes whose arguments' names do not say their role. ``labelled=False``: the same tools
    without any label, as every Python tool was before D-73."""
    directory_labels: dict[str, Any] = (
        {"trust": "trusted", "trust_fields": {"forward_to": "untrusted"}} if labelled else {})

    @tool(namespace="crm", read_only=True, **directory_labels)
    def lookup(name: str) -> dict:
        """A person in the user's own directory."""
        return {"name": name, "email": BOB, "forward_to": ATTACKER, "manager": {"email": CAROL}}

    @tool(namespace="mail", read_only=True, open_world=True)
    def inbox() -> list[dict]:
        """The inbox: anyone can write to it."""
        return [{"id": "m-1", "sender": BOB, "reply_to": "eve@evil.example", "ticket": "ticket-88172", "acct": "acct-99172"}]

    @tool(namespace="mail")
    def send(recipients: list[str], subject: str, body: str) -> dict:
        """Send an e-mail."""
        sent.append({"recipients": recipients, "subject": subject})
        return {"ok": True}

    @tool(namespace="ops", **({"roles": {"ref": ref_role}} if ref_role else {}))
    def file_under(ref: str, note: str) -> dict:
        """File the case under ``ref``."""
        sent.append({"ref": ref})
        return {"ok": True}

    @tool(namespace="ops", **({"roles": {"account": account_role}} if account_role else {}))
    def annotate(account: str, note: str) -> dict:
        """Put a note on an account."""
        sent.append({"account": account})
        return {"ok": True}

    return [lookup, inbox, send, file_under, annotate]


def asking(result: Any) -> list[dict[str, Any]]:
    assert result.status == "paused", result.error
    return [r for w in result.pending["writes"] for r in w["reasons"] if r["asks"]]


SEND = "import tools\n{read}\nawait tools.mail.send(recipients=[{to}], subject='s', body='b')\n"


async def test_p45_d73_a_destination_from_a_tool_marked_trusted_goes_out_unasked():
    sent: list[dict[str, Any]] = []
    async with Runtime(tools=mailbox(sent), policy=GUARD, type_check=False) as rt:
        done = await rt.execute(SEND.format(read="d = await tools.crm.lookup(name='Bob')", to="d['email']"))
        assert done.status == "completed", done.error
        # Nested fields of a trusted tool are trusted too.
        nested = await rt.execute(SEND.format(read="d = await tools.crm.lookup(name='Bob')",
                                              to="d['manager']['email']"))
        assert nested.status == "completed", nested.error
    assert [m["recipients"] for m in sent] == [[BOB], [CAROL]]


async def test_p45_d73_the_same_value_from_an_unlabelled_python_tool_asks_naming_it():
    sent: list[dict[str, Any]] = []
    async with Runtime(tools=mailbox(sent), policy=GUARD, type_check=False) as rt:
        paused = await rt.execute(SEND.format(read="m = await tools.mail.inbox()", to="m[0]['sender']"))
        [why] = asking(paused)
        assert why["arg"].startswith("recipients") and "mail.inbox" in why["says"]
        assert why["origin"]["address"] == "mail.inbox"
    assert sent == []


async def test_p45_d73_without_labels_the_directory_asks_as_before():
    """The default a label changes (D-64): the same directory tool, unlabelled, is untrusted."""
    sent: list[dict[str, Any]] = []
    async with Runtime(tools=mailbox(sent, labelled=False), policy=GUARD, type_check=False) as rt:
        paused = await rt.execute(SEND.format(read="d = await tools.crm.lookup(name='Bob')", to="d['email']"))
        [why] = asking(paused)
        assert "crm.lookup" in why["says"]
    assert sent == []


async def test_p45_d73_trust_fields_make_one_field_of_a_trusted_tool_untrusted():
    sent: list[dict[str, Any]] = []
    async with Runtime(tools=mailbox(sent), policy=GUARD, type_check=False) as rt:
        paused = await rt.execute(SEND.format(read="d = await tools.crm.lookup(name='Bob')", to="d['forward_to']"))
        [why] = asking(paused)
        assert "crm.lookup" in why["says"] and why["origin"]["address"] == "crm.lookup"
        # The read journals the untrusted field's marks only.
        marks = rt.store.get_calls(paused.run_id)[0].lineage["marks"]
        assert [m[2] for m in marks] == [".forward_to"]
        # Another field of the same result, in a run of its own, goes out.
        other = await rt.execute(SEND.format(read="d = await tools.crm.lookup(name='Bob')", to="d['email']"))
        assert other.status == "completed", other.error
    assert [m["recipients"] for m in sent] == [[BOB]]


@pytest.mark.parametrize(("role", "status"), [(None, "completed"), ("destination", "paused")])
async def test_p45_d73_roles_make_an_argument_with_an_uninformative_name_a_destination(role, status):
    sent: list[dict[str, Any]] = []
    async with Runtime(tools=mailbox(sent, ref_role=role), policy=GUARD, type_check=False) as rt:
        result = await rt.execute("import tools\nm = await tools.mail.inbox()\n"
                                  "await tools.ops.file_under(ref=m[0]['ticket'], note='n')")
        assert result.status == status, result.error
        if role:
            [why] = asking(result)
            assert why["arg"] == "ref" and "mail.inbox" in why["says"]
    assert sent == ([] if role else [{"ref": "ticket-88172"}])


@pytest.mark.parametrize(("role", "status"), [(None, "paused"), ("content", "completed")])
async def test_p45_d73_roles_make_an_argument_content(role, status):
    sent: list[dict[str, Any]] = []
    async with Runtime(tools=mailbox(sent, account_role=role), policy=GUARD, type_check=False) as rt:
        result = await rt.execute("import tools\nm = await tools.mail.inbox()\n"
                                  "await tools.ops.annotate(account=m[0]['acct'], note='n')")
        assert result.status == status, result.error
    assert sent == ([{"account": "acct-99172"}] if role else [])


@pytest.mark.parametrize(("labels", "said"), [
    ({"trust": "yes"}, 'trust must be "trusted" or "untrusted", not \'yes\''),
    ({"trust": True}, 'trust must be "trusted" or "untrusted"'),
    ({"trust_fields": {"body": "maybe"}}, 'trust_fields[\'body\'] must be "trusted" or "untrusted"'),
    ({"trust_fields": {"items[0].body": "trusted"}}, "list indices left out"),
    ({"trust_fields": {"a..b": "trusted"}}, "is not a field path"),
    ({"trust_fields": ["body"]}, "trust_fields must be a mapping"),
    ({"roles": {"to": "recipient"}}, 'roles[\'to\'] must be "destination" or "content", not \'recipient\''),
    ({"roles": {"where": "destination"}}, "'where', which is not an argument of the tool (its arguments: body, to)"),
])
def test_p45_d73_bad_labels_are_refused_when_the_tool_is_declared(labels, said):
    with pytest.raises(InvalidToolDefinition) as caught:
        @tool(namespace="x", **labels)
        def post(to: str, body: str) -> None:
            """Post."""
    assert said in caught.value.message and "x.post" in caught.value.message
    assert caught.value.code == "invalid_tool_definition" and caught.value.next_action


def test_p45_d73_a_tool_built_directly_carries_checked_labels_and_kwargs_take_any_role():
    async def handler(args: dict) -> Any:
        return None

    schema = {"type": "object", "properties": {"to": {"type": "string"}}}
    with pytest.raises(InvalidToolDefinition, match="trusted"):
        Tool("x", "y", "", schema, handler, trust="TRUSTED")
    with pytest.raises(InvalidToolDefinition, match="not an argument"):
        Tool("x", "y", "", schema, handler, roles={"from": "destination"})
    fields = {"a": "untrusted"}
    made = Tool("x", "y", "", schema, handler, trust="trusted", trust_fields=fields)
    fields["a"] = "trusted"  # the tool keeps its own copy
    assert made.trust_fields == {"a": "untrusted"}

    @tool(namespace="x", roles={"anything": "destination"})
    def loose(**kwargs: Any) -> None:
        """Takes any argument."""
    assert loose.__tether_tool__.to_tool().roles == {"anything": "destination"}  # type: ignore[attr-defined]


RESUMED = """
import tools
d = await tools.crm.lookup(name="Bob")
m = await tools.mail.inbox()
await tools.mail.send(recipients=[m[0]["reply_to"]], subject="1", body="b")
await tools.mail.send(recipients=[d["manager"]["email"]], subject="2", body="b")
await tools.mail.send(recipients=[m[0]["reply_to"]], subject="3", body="b")
"""


async def test_p45_d73_a_resume_in_a_fresh_runtime_with_the_same_tools_decides_the_same_way(tmp_path):
    url = f"sqlite:///{tmp_path}/tether.db"
    sent: list[dict[str, Any]] = []
    async with Runtime(store=open_store(url), tools=mailbox(sent), policy=GUARD, type_check=False) as rt:
        paused = await rt.execute(RESUMED)
        [why] = asking(paused)
        assert paused.pending["seq"] == 3 and "mail.inbox" in why["says"]
    # Another Runtime over the same store, as another process would open it: the write it reaches first comes
    # from the trusted directory and goes out; the next one from the inbox asks, as the first one did.
    async with Runtime(store=open_store(url), tools=mailbox(sent), policy=GUARD, type_check=False) as rt:
        again = await rt.resume(paused.run_id, "approve")
        [why] = asking(again)
        assert again.pending["seq"] == 5 and "mail.inbox" in why["says"], why
        done = await rt.resume(paused.run_id, "approve", seq=5)
        assert done.status == "completed", done.error
        verdicts = [e.lineage["ask"] for e in rt.store.get_calls(paused.run_id) if e.kind == "write"]
    assert verdicts == [True, False, True]
    assert [m["subject"] for m in sent] == ["1", "2", "3"]


# -- a [[sources]] table and a tool's own labels for the same tool (D-73) --------------------------------------


def _tool(address: str, **labels: Any) -> Any:
    async def handler(args: dict) -> Any:
        return None

    namespace, name = address.split(".")
    return Tool(namespace, name, "", {"type": "object", "properties": {"subject": {}, "to": {}}}, handler, **labels)


def test_p45_d73_a_table_and_a_tool_that_disagree_give_the_stricter_label_field_and_role():
    table = {"trust": "trusted", "trust_tools": {"inbox": "untrusted"},
             "trust_fields": {"lookup.notes": "untrusted", "inbox.meta": "trusted"},
             "roles": {"send.subject": "content", "send.to": "content"}}
    tools = [_tool("mail.lookup", trust="trusted", trust_fields={"email": "untrusted"}),
             _tool("mail.inbox", trust="trusted"),
             _tool("mail.send", roles={"subject": "destination", "to": "content"}),
             _tool("web.page", trust="trusted")]
    labels = labels_from([("mail", table)], tools)
    lookup = labels.of("mail.lookup")
    # Each side's untrusted field stays untrusted; what neither singles out is trusted by both.
    assert lookup.label_at(".notes") == lookup.label_at(".email") == "untrusted"
    assert lookup.label_at(".name") == "trusted"
    # The table's untrusted tool wins over the tool's trusted; the table's trusted field stays trusted (both).
    inbox = labels.of("mail.inbox")
    assert inbox.label == "untrusted" and inbox.label_at("[0].meta.at") == "trusted"
    assert labels.roles_of("mail.send") == {"subject": "destination", "to": "content"}
    # A tool no table names keeps its own label; one neither labels is untrusted (D-64).
    assert labels.of("web.page").label == "trusted" and labels.of("web.other").label == "untrusted"
    said = labels.disagreements()
    assert "mail.inbox: the [[sources]] table says untrusted, the tool says trusted; untrusted holds" in said
    assert "field email of mail.lookup: the [[sources]] table says trusted, the tool says untrusted; " \
           "untrusted holds" in said
    assert "argument subject of mail.send: the [[sources]] table says content, the tool says destination; " \
           "destination holds" in said
    assert not any("to of mail.send" in line or "web.page" in line for line in said)


LABELLED_MODULE = '''
TETHER_NAMESPACE = "crm"
from tether import tool

@tool(read_only=True, trust="trusted", trust_fields={"forward_to": "untrusted"})
def lookup(name: str) -> dict:
    """A person in the directory."""
    return {"name": name, "email": "bob@corp.example", "forward_to": "mallory@evil.example"}

@tool
def send(recipients: list, subject: str) -> dict:
    """Send."""
    import json, os
    with open(os.environ["CRM_SENT"], "a") as f:
        f.write(json.dumps(recipients) + "\\n")
    return {"ok": True}
'''


@pytest.mark.parametrize(("table", "email"), [
    ({}, "completed"),  # the tool's own labels reach a guarded run loaded from tether.toml
    ({"trust": "trusted"}, "completed"),  # agreeing: the tool's untrusted field still asks
    ({"trust_tools": {"lookup": "untrusted"}}, "paused"),  # the table's untrusted holds over the tool's trusted
])
async def test_p45_d73_a_python_source_table_over_labelled_tools_keeps_the_stricter(tmp_path, monkeypatch, table,
                                                                                   email):
    from tether._app import open_runtime
    from tether._config import Config
    from tether._engine.lineage import trust

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    logged = Lines()
    logger = logging.getLogger("tether.lineage")
    logger.addHandler(logged)
    # Whatever level another test left on the "tether" loggers, warnings reach this handler.
    level = logger.level
    logger.setLevel(logging.WARNING)
    monkeypatch.setattr(trust, "_SAID", set())

    module = tmp_path / "crm_tools.py"
    module.write_text(LABELLED_MODULE)
    monkeypatch.setenv("CRM_SENT", str(tmp_path / "sent.jsonl"))
    config = Config.from_dict({"policy": {"writes": "guard"},
                               "sources": [{"type": "python", "module": str(module), **table}]},
                              env={"TETHER_HOME": str(tmp_path / "home")})
    program = ("import tools\nd = await tools.crm.lookup(name='Bob')\n"
               "await tools.crm.send(recipients=[d[{field!r}]], subject='s')")
    try:
        async with open_runtime(config, store_url=f"sqlite:///{tmp_path}/t.db", type_check=False) as rt:
            by_email = await rt.execute(program.format(field="email"))
            assert by_email.status == email, by_email.error
            forwarded = await rt.execute(program.format(field="forward_to"))
            [why] = asking(forwarded)
            assert "crm.lookup" in why["says"]
    finally:
        logger.removeHandler(logged)
        logger.setLevel(level)
    sent = tmp_path / "sent.jsonl"
    assert [json.loads(line) for line in sent.read_text().splitlines()] == [[BOB]] if email == "completed" \
        else not sent.exists()
    # A table that says otherwise than the tool is logged, once per process, whichever way it is resolved.
    assert len(logged.lines) == (0 if not table else 1)
    assert all("trust labels disagree (D-73)" in line and "untrusted holds" in line for line in logged.lines)


async def test_p45_d73_a_tool_built_directly_and_added_later_is_labelled_too():
    sent: list[dict[str, Any]] = []

    async def book(args: dict) -> Any:
        return [{"email": BOB}]

    trusted = Tool("crm", "book", "The user's address book.", {"type": "object", "properties": {}}, book,
                   annotations=Annotations(read_only=True), trust="trusted")
    async with Runtime(tools=mailbox(sent), policy=GUARD, type_check=False) as rt:
        rt.add_tools(trusted)
        done = await rt.execute(SEND.format(read="b = await tools.crm.book()", to="b[0]['email']"))
        assert done.status == "completed", done.error
        # A wholly trusted read journals no marks (P-45): nothing of it is remembered as untrusted.
        assert rt.store.get_calls(done.run_id)[0].lineage is None
    assert [m["recipients"] for m in sent] == [[BOB]]

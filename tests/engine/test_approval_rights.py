"""Approvals the agent cannot give itself (P-33, P-37), in process.

The agent here holds the token that ran the program, reads every result and
can fetch any URL: the real ``mcp`` client plays it, with an elicitation
callback that answers for the user and fetches whatever link it is sent
(httpx over the console's ASGI app). Every write that reaches the tools is
in ``rec.deliveries``; "nothing sent" is read from there.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitResult, InputRequiredResult

from helpers import Recorder
from tether._engine.approvals import APPROVE, METRICS, OPERATE, RUN, Access, Channel, Grant, may_decide, may_see
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy, Rule
from tether._runtime import Runtime
from tether._server.approvals import link_token
from tether._server.auth import principal_for_token
from tether._server.console import Console
from tether._server.mcp import TetherServer

ERAS = [pytest.param("legacy", id="legacy"), pytest.param("auto", id="modern")]
PUBLIC = "https://tether.example.com"
AGENT, PAT = "agent-token-0123456789", "pat-token-0123456789ab"
AGENT_P, PAT_P = principal_for_token(AGENT), principal_for_token(PAT)
COMMENT = "import tools\nawait tools.helpdesk.add_comment(id=3, body='refund 10000 USD')"
# helpdesk.close_ticket's rule requires a signed-in approver.
CLOSE = "import tools\nawait tools.helpdesk.close_ticket(id=3)"
POLICY = Policy(rules=(Rule("helpdesk.close_ticket", "ask", "signed_in"),))


def access(*, self_approval: bool = False, links: str = "signed_in") -> Access:
    # The agent's token has run *and* approve (as TETHER_TOKEN does): approve of its own runs still needs self_approval.
    return Access.of([Grant(AGENT_P, "agent", frozenset({RUN, APPROVE})),
                      Grant(PAT_P, "pat", frozenset({APPROVE}), frozenset({AGENT_P}))],
                     self_approval=self_approval, links=links)


@pytest.fixture
def rec():
    return Recorder()


@pytest.fixture
async def rt(rec):
    async with Runtime(tools=rec.tools(), type_check=False, policy=POLICY,
                       limits=Limits(run_seconds=10, call_timeout_seconds=5)) as runtime:
        yield runtime


def served(rt, **options) -> tuple[TetherServer, Console]:
    grants = options.pop("access", None) or access()
    server = TetherServer(rt, principal_of=lambda ctx: AGENT_P, access=grants, public_url=PUBLIC,
                          url_wait_seconds=0.5, **options)
    return server, Console(rt, tokens=[AGENT, PAT], access=grants, public_url=PUBLIC)


def browser(console: Console) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url=PUBLIC)


def csrf_of(html: str) -> str | None:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    return found.group(1) if found else None


async def sign_in(c: httpx.AsyncClient, token: str) -> int:
    page = await c.get("/console/login")
    return (await c.post("/console/login", data={"csrf": csrf_of(page.text), "token": token})).status_code


class Rogue:
    """The agent's elicitation callback: approves every form, and fetches every link and approves on its page."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.forms = 0
        self.links: list[str] = []
        self.answers: list[tuple[str, int]] = []  # (what it tried, HTTP status)

    async def __call__(self, context, params):
        if getattr(params, "mode", None) != "url":
            self.forms += 1
            return ElicitResult(action="accept", content={"decision": "approve"})
        self.links.append(params.url)
        await attack_link(self.console, params.url, self.answers)
        return ElicitResult(action="accept")


async def attack_link(console: Console, url: str, answers: list[tuple[str, int]]) -> None:
    """Every way the holder of the agent's token and a link can try to approve through the link and the console."""
    path = urlsplit(url).path
    run_id = console.rt.store.list_runs(limit=1)[0].run_id
    async with browser(console) as c:
        page = await c.get(path)
        answers.append(("link page", page.status_code))
        answers.append(("approve button without sign-in", int('value="approve"' in page.text)))
        form = {"csrf": csrf_of(page.text) or "none", "seq": "1", "decision": "approve"}
        answers.append(("link POST without sign-in", (await c.post(path, data=form)).status_code))
        answers.append(("console sign-in with the agent's token", await sign_in(c, AGENT)))
        page = await c.get(path)
        answers.append(("approve button signed in as the agent", int('value="approve"' in page.text)))
        form["csrf"] = csrf_of(page.text) or "none"
        answers.append(("link POST signed in as the agent", (await c.post(path, data=form)).status_code))
        run_page = await c.get(f"/console/runs/{run_id}")
        form["csrf"] = csrf_of(run_page.text) or "none"
        answers.append(("console POST as the agent",
                        (await c.post(f"/console/runs/{run_id}/decide", data=form)).status_code))


def refused(answers: list[tuple[str, int]]) -> None:
    got = dict(answers)
    assert got["link page"] == 200  # the page shows the write to whoever holds the link
    assert got["approve button without sign-in"] == 0 and got["approve button signed in as the agent"] == 0
    assert got["link POST without sign-in"] in (401, 403)
    assert got["console sign-in with the agent's token"] == 303
    assert got["link POST signed in as the agent"] == 403 and got["console POST as the agent"] == 403


# -- 1. the agent approves its own writes ------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_resume_answers_an_approve_from_the_runs_own_token_with_approval_elsewhere(rt, rec, mode):
    server, _ = served(rt)
    async with Client(server.mcp, mode=mode) as c:
        paused = (await c.call_tool("execute", {"code": COMMENT})).structured_content
        assert paused["status"] == "paused"
        # The instructions the model reads say where a person approves, and name resume only to stop it.
        assert "console/runs/" + paused["run_id"] in paused["instructions"]
        assert '"decision": "approve"' not in paused["instructions"]
        for seq in (1, [1], None):
            r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve",
                                             **({"seq": seq} if seq is not None else {})})
            error = r.structured_content["error"]
            assert r.is_error and error["code"] == "approval_elsewhere", error
            assert "nothing was sent" in error["message"] and f"{PUBLIC}/console/runs/" in error["message"]
        assert rec.deliveries == [] and rt.store.get_run(paused["run_id"]).status == "paused"
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "decline", "reason": "no"})
        assert r.structured_content["status"] == "failed"
    assert rec.deliveries == []


async def test_the_store_command_approval_elsewhere_names_is_one_the_cli_takes(rt, rec):
    """The operator is told to approve "on the store" with a command: it must exist and name the run, or the
    advice ends in a usage error. It is `tether runs show RUN`, which prints the approve line with the run's
    owner (tests/cli/test_operator_cli.py runs that line), so the owner is not written into what the model reads."""
    from tether.cli import build_parser

    server, _ = served(rt)
    async with Client(server.mcp, mode="legacy") as c:
        paused = (await c.call_tool("execute", {"code": COMMENT})).structured_content
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve", "seq": 1})
    for text in (paused["instructions"], r.structured_content["error"]["message"]):
        command = re.search(r"`(tether [^`]+)`", text)
        assert command is not None, text
        args = build_parser().parse_args(command.group(1).split()[1:])
        assert args.run_id == paused["run_id"] and AGENT_P not in text


async def test_self_approval_is_an_explicit_setting(rt, rec):
    server, _ = served(rt, access=access(self_approval=True))
    async with Client(server.mcp, mode="legacy") as c:
        paused = (await c.call_tool("execute", {"code": COMMENT})).structured_content
        assert '"decision": "approve"' in paused["instructions"]
        r = await c.call_tool("resume", {"run_id": paused["run_id"], "decision": "approve"})
    assert r.structured_content["status"] == "completed"
    assert rec.deliveries == [("add_comment", {"id": 3, "body": "refund 10000 USD"})]


# -- 2, 3. the link travels through the agent ----------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_that_fetches_its_approval_link_approves_nothing(rt, rec, mode):
    server, console = served(rt, approvals="url")
    rogue = Rogue(console)
    async with Client(server.mcp, mode=mode, elicitation_callback=rogue) as c:
        if mode == "legacy":
            r = await c.call_tool("execute", {"code": COMMENT})
        else:
            # Driven by hand: the SDK would retry for as long as the server asks again.
            first = await c.session.call_tool("execute", {"code": COMMENT}, allow_input_required=True)
            assert isinstance(first, InputRequiredResult)
            request = first.input_requests["approval"].params
            answer = await rogue(None, request)
            again = await c.session.call_tool("execute", {"code": COMMENT}, allow_input_required=True,
                                              input_responses={"approval": answer},
                                              request_state=first.request_state)
            # Nobody decided on the page in time: the answer is the paused envelope, which
            # still waits for a person, not another round with the same link.
            assert not isinstance(again, InputRequiredResult) and rec.deliveries == []
            r = again
    assert len(rogue.links) == 1 and rogue.links[0].startswith(f"{PUBLIC}/approve/")
    refused(rogue.answers)
    data = r.structured_content
    assert data["status"] == "paused" and rec.deliveries == []
    # What the model reads carries no link and no key.
    assert "/approve/" not in r.content[0].text and "key" not in data["pending"]["writes"][0]
    # A person who may approve signs in, opens the same link and decides.
    async with browser(console) as person:
        assert await sign_in(person, PAT) == 303
        path = urlsplit(rogue.links[0]).path
        page = await person.get(path)
        assert 'value="approve"' in page.text
        done = await person.post(path, data={"csrf": csrf_of(page.text), "seq": "1", "decision": "approve"})
        assert done.status_code == 200 and "Approved call 1: sent." in done.text
    assert rec.deliveries == [("add_comment", {"id": 3, "body": "refund 10000 USD"})]
    decided = [e.data for e in rt.store.get_events(data["run_id"]) if e.type == "decided"]
    assert [(d["actor"], d["via"]) for d in decided] == [("token \u201cpat\u201d", "link")]


# -- a rule that requires a signed-in approver ----------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_a_tool_that_requires_a_signed_in_approver_is_never_put_to_the_clients_form(rt, rec, mode):
    server, _ = served(rt, approvals="form")
    rogue = Rogue(Console(rt, tokens=[AGENT], access=access()))
    async with Client(server.mcp, mode=mode, elicitation_callback=rogue) as c:
        r = await c.call_tool("execute", {"code": CLOSE})
        data = r.structured_content
        assert data["status"] == "paused" and rogue.forms == 0 and rec.deliveries == []
        r = await c.call_tool("resume", {"run_id": data["run_id"], "decision": "approve", "seq": 1})
        assert r.structured_content["error"]["code"] == "approval_elsewhere"
    # A form on a write that does not require it is still the client application's question.
    async with Client(server.mcp, mode=mode, elicitation_callback=rogue) as c:
        r = await c.call_tool("execute", {"code": COMMENT})
    assert r.structured_content["status"] == "completed" and rogue.forms == 1
    assert rec.deliveries == [("add_comment", {"id": 3, "body": "refund 10000 USD"})]


async def test_an_input_required_retry_the_agent_makes_up_decides_nothing(rt, rec):
    # No form was put for the write, so there is no sealed request state to answer: one the agent
    # writes itself (tether's own signature included) is refused before any tool runs.
    server, _ = served(rt, approvals="form")
    async with Client(server.mcp, mode="auto", elicitation_callback=Rogue(Console(rt, tokens=[AGENT]))) as c:
        paused = (await c.call_tool("execute", {"code": CLOSE})).structured_content
        state = server.sign_state(paused["run_id"], 1, AGENT_P)
        answer = {"approval": ElicitResult(action="accept", content={"decision": "approve"})}
        with pytest.raises(MCPError, match="requestState"):
            await c.call_tool("execute", {"code": CLOSE}, input_responses=answer, request_state=state)
        first = await c.session.call_tool("execute", {"code": COMMENT}, allow_input_required=True)
        assert isinstance(first, InputRequiredResult)  # a write without the rule still gets its form
    assert rec.deliveries == [] and rt.store.get_run(paused["run_id"]).status == "paused"


async def test_an_approver_decides_in_the_console_and_is_recorded_by_name(rt, rec):
    server, console = served(rt)
    async with Client(server.mcp, mode="legacy") as c:
        paused = (await c.call_tool("execute", {"code": CLOSE})).structured_content
    async with browser(console) as person:
        await sign_in(person, PAT)
        listing = (await person.get("/console/")).text
        assert paused["run_id"] in listing  # the agent's run, seen by whoever approves for it
        page = await person.get(f"/console/runs/{paused['run_id']}")
        done = await person.post(f"/console/runs/{paused['run_id']}/decide",
                                 data={"csrf": csrf_of(page.text), "seq": "1", "decision": "approve"})
        assert done.status_code == 303
    assert (await rt.engine.wait_for_run(paused["run_id"])).status == "completed"
    assert rec.deliveries == [("close_ticket", {"id": 3})]
    decided = [e.data for e in rt.store.get_events(paused["run_id"]) if e.type == "decided"]
    assert [(d["actor"], d["via"]) for d in decided] == [("token \u201cpat\u201d", "console")]


async def test_a_link_in_capability_mode_still_refuses_a_signed_in_tool_without_sign_in(rt, rec):
    server, console = served(rt, access=access(links="capability"))
    async with Client(server.mcp, mode="legacy") as c:
        paused = (await c.call_tool("execute", {"code": CLOSE})).structured_content
    token = link_token(rt.store.secret(), paused["run_id"], 1, rt.store.get_run(paused["run_id"]).expires_at)
    async with browser(console) as holder:
        page = await holder.get(f"/approve/{token}")
        r = await holder.post(f"/approve/{token}", data={"csrf": csrf_of(page.text), "seq": "1",
                                                         "decision": "approve"})
        assert r.status_code == 403 and "signed-in approver" in r.text
    assert rec.deliveries == []


# -- the decision function itself ---------------------------------------------------------


def test_who_may_decide():
    a = access()
    agent, pat = a.grant(AGENT_P), a.grant(PAT_P)
    ops = Grant("token:ops", "ops", frozenset({OPERATE}))
    runner = Grant("token:ci", "ci", frozenset({RUN}))
    ok = lambda g, owner, decision, channel, **kw: may_decide(a, g, owner, decision, channel, **kw).ok  # noqa: E731
    # The agent stops its own writes anywhere; it approves them nowhere.
    for channel in (Channel.RESUME, Channel.CONSOLE, Channel.LINK):
        assert ok(agent, AGENT_P, "decline", channel) and ok(agent, AGENT_P, "cancel", channel)
        assert not ok(agent, AGENT_P, "approve", channel)
    assert may_decide(a, agent, AGENT_P, "approve", Channel.RESUME).code == "approval_elsewhere"
    assert may_decide(a, agent, AGENT_P, "approve", Channel.CONSOLE).code == "self_approval"
    # The client application's form stays, unless the tool's rule requires a signed-in approver.
    assert ok(agent, AGENT_P, "approve", Channel.FORM)
    assert not ok(agent, AGENT_P, "approve", Channel.FORM, signed_in_required=True)
    # A person approves for the agent, signed in; not for principals it was not made approver of.
    assert ok(pat, AGENT_P, "approve", Channel.CONSOLE, signed_in_required=True)
    assert may_decide(a, pat, "token:other", "approve", Channel.CONSOLE).code == "run_not_found"
    assert may_see(a, pat, AGENT_P) and not may_see(a, pat, "token:other") and not may_see(a, runner, AGENT_P)
    # Operate: everything but self-approval; the operator on the store: everything.
    assert ok(ops, AGENT_P, "approve", Channel.CONSOLE) and not ok(ops, "token:ops", "approve", Channel.CONSOLE)
    assert ok(None, AGENT_P, "approve", Channel.OPERATOR, signed_in_required=True)
    assert may_decide(a, runner, "token:ci", "approve", Channel.CONSOLE).code == "not_an_approver"
    # A link without sign-in decides only in capability mode.
    assert may_decide(a, None, AGENT_P, "approve", Channel.LINK_CAPABILITY).code == "sign_in_required"
    cap = access(links="capability")
    assert may_decide(cap, None, AGENT_P, "approve", Channel.LINK_CAPABILITY).ok


def test_p46_undoing_a_runs_writes_needs_what_approving_needs():
    """D-68: an undo sends writes, so decline_and_undo is decided like approve, and never on a capability link."""
    a = access()
    agent, pat = a.grant(AGENT_P), a.grant(PAT_P)
    assert may_decide(a, agent, AGENT_P, "decline_and_undo", Channel.RESUME).code == "approval_elsewhere"
    assert may_decide(a, agent, AGENT_P, "decline_and_undo", Channel.CONSOLE).code == "self_approval"
    assert may_decide(a, pat, AGENT_P, "decline_and_undo", Channel.CONSOLE).ok
    assert may_decide(a, Grant("token:ci", "ci", frozenset({RUN})), "token:ci", "decline_and_undo",
                      Channel.CONSOLE).code == "not_an_approver"
    cap = access(links="capability")
    assert may_decide(cap, None, AGENT_P, "decline_and_undo", Channel.LINK_CAPABILITY).code == "sign_in_required"
    assert may_decide(access(self_approval=True), agent, AGENT_P, "decline_and_undo", Channel.RESUME).ok


# -- configuration ------------------------------------------------------------------------


def test_tokens_get_their_rights_from_the_configuration():
    from tether._config import Config
    from tether._engine.approvals.grants import server_access
    from tether.errors import UsageError

    config = Config.from_dict({"server": {"tokens": [
        {"name": "agent", "token_env": "AGENT_TOKEN", "rights": ["run"]},
        {"name": "pat", "token_env": "PAT_TOKEN", "rights": ["approve"], "approves_for": ["agent", "TETHER_TOKEN"]},
    ]}}, env={})
    env = {"AGENT_TOKEN": AGENT, "PAT_TOKEN": PAT}
    legacy = "legacy-token-0123456789"
    got, tokens = server_access(config.server, (legacy,), env, principal_for_token, http=True)
    assert set(tokens) == {legacy, AGENT, PAT} and got.self_approval is False and got.links == "signed_in"
    pat = got.grant(PAT_P)
    assert pat.name == "pat" and pat.approves_for == {AGENT_P, principal_for_token(legacy)}
    assert got.grant(principal_for_token(legacy)).rights == {RUN, APPROVE, METRICS}  # TETHER_TOKEN: as before, minus self-approval
    assert got.grant(principal_for_token(legacy)).name == "TETHER_TOKEN"
    # Standard input/output tells nobody apart: the one principal is local, and it approves its own writes (D-31).
    stdio, _ = server_access(config.server, (legacy,), {}, principal_for_token, http=False)  # no token needed
    assert stdio.self_approval is True and set(stdio.grants) == {"local"}
    with pytest.raises(UsageError) as missing:
        server_access(config.server, (), {"AGENT_TOKEN": AGENT}, principal_for_token, http=True)
    assert missing.value.code == "token_required" and "PAT_TOKEN" in missing.value.message
    strict = Config.from_dict({"server": {"self_approval": False}}, env={})
    assert server_access(strict.server, (), {}, principal_for_token, http=False)[0].self_approval is False


async def test_an_inline_approver_is_not_asked_about_a_signed_in_tool_unless_it_is_the_operators_prompt(rt, rec):
    asked: list[str] = []

    async def form(pending):
        asked.append(pending["address"])
        return "approve", None

    paused = await rt.execute(CLOSE, on_approval=form)
    assert paused.status == "paused" and asked == [] and rec.deliveries == []
    form.signed_in = True  # what `tether run` marks its terminal prompt with: the operator
    done = await rt.execute(CLOSE, on_approval=form)
    assert done.status == "completed" and asked == ["helpdesk.close_ticket"]


async def test_a_paused_cell_shows_the_agent_no_key_and_no_approve_call(rt, rec):
    server, _ = served(rt)
    async with Client(server.mcp, mode="legacy") as c:
        obs = (await c.call_tool("cell_start", {"code": COMMENT, "yield_after_ms": 5000})).structured_content
        assert obs["status"] == "paused"
        text = str(obs)
        assert "'key'" not in text and "/approve/" not in text
        assert "console/runs/" + obs["cell_id"] in obs["instructions"]
        assert '"decision": "approve"' not in obs["instructions"]
        r = await c.call_tool("resume", {"run_id": obs["cell_id"], "decision": "approve", "seq": 1})
        assert r.structured_content["error"]["code"] == "approval_elsewhere"
    assert rec.deliveries == []

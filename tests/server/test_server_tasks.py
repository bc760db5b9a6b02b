"""MCP Tasks (P-47): FastMCP's own Client, with fastmcp-tasks, drives tether's execute as a task over streamable HTTP.

Every server here is a real ``tether serve --http`` process on a store in a temporary folder; a restart
is a new process on the same store and port, a replica is another process on the same store. The
client is FastMCP's ``Client``: it declares the tasks extension, polls ``tasks/get``, answers a task's
question through its elicitation handler (``tasks/update``) and cancels with ``tasks/cancel``. A person
decides on the approval link page or the console, signed in with a token of their own.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastmcp import Client
from fastmcp_tasks import ToolTask, call_tool_task
from fastmcp_tasks.client_models import UpdateTaskRequest, UpdateTaskRequestParams
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitRequestFormParams, ElicitRequestURLParams, ElicitResult, Result
from tests.server.test_server_http import LEDGER_TOOLS, stop_server

from helpers import free_port
from replicas import ReplicaSet, wait_ready
from tether._store import open_store

pytestmark = pytest.mark.slow

AGENT, OTHER, PAT = "agent-token-0123456789abcdef", "other-token-0123456789abcdef", "pat-token-0123456789abcdef"

CONFIG = """\
[server]
public_url = "http://127.0.0.1:{port}"
approvals = "{approvals}"
task_after_seconds = 1

[[server.tokens]]
name = "agent"
token_env = "AGENT_TOKEN"
rights = ["run"]

[[server.tokens]]
name = "other"
token_env = "OTHER_TOKEN"
rights = ["run"]

[[server.tokens]]
name = "pat"
token_env = "PAT_TOKEN"
rights = ["approve"]
approves_for = ["agent"]

[sandbox]
max_workers = 2

[[policy.rules]]
match = "ledger.guarded_write"
action = "ask"
approver = "signed_in"

[[policy.rules]]
match = "ledger.write"
action = "ask"
"""


def guarded(tag: str) -> str:
    return f"import tools\nawait tools.ledger.guarded_write(tag='{tag}')"


def asked_write(tag: str) -> str:
    return (f"import tools\ntry:\n    r = await tools.ledger.write(tag='{tag}')\n"
            "except PermissionError as e:\n    r = 'refused: ' + str(e)\nr")


class Tether:
    """One ``tether serve --http`` on a store of its own; ``restart()`` is a new process on the same store and port."""

    def __init__(self, root: Path, approvals: str, config: str = CONFIG) -> None:
        self.root, self.port = root, free_port()
        self.base, self.url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.port}/mcp"
        root.mkdir(parents=True, exist_ok=True)
        (root / "ledger_tools.py").write_text(LEDGER_TOOLS)
        (root / "tether.toml").write_text(config.format(port=self.port, approvals=approvals))
        self.ledger = root / "ledger.txt"
        self.env = {k: v for k, v in os.environ.items() if k not in ("TETHER_TOKEN", "TETHER_STORE_URL")}
        self.env.update(TETHER_HOME=str(root / "home"), LEDGER=str(self.ledger), AGENT_TOKEN=AGENT,
                        OTHER_TOKEN=OTHER, PAT_TOKEN=PAT)
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.start()

    def start(self) -> None:
        self.starts += 1
        log = self.root / f"server{self.starts}.log"
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tether.cli", "--config", str(self.root / "tether.toml"), "serve",
                 "--http", f"127.0.0.1:{self.port}", "--tools", str(self.root / "ledger_tools.py")],
                env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        wait_ready(self.proc, self.base, log)

    def restart(self) -> None:
        assert self.proc is not None
        stop_server(self.proc)
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)

    def tags(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def run(self, run_id: str):
        store = open_store(f"sqlite:///{self.root / 'home' / 'tether.db'}")
        try:
            return store.get_run(run_id), store.get_events(run_id)
        finally:
            store.close()


@pytest.fixture
def tether_url(tmp_path):
    servers: list[Tether] = []

    def make(approvals: str, config: str = CONFIG) -> Tether:
        servers.append(Tether(tmp_path / f"t{len(servers)}", approvals, config))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def run_of(task: ToolTask) -> str:
    return task.task_id.rpartition(".")[0]


async def signed_in(web: httpx.AsyncClient, token: str) -> None:
    page = await web.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert (await web.post("/console/login", data={"csrf": csrf, "token": token})).status_code == 303


async def approve_on_link(base: str, link: str, seq: int) -> None:
    """A person signs in with their own token, opens the approval link and approves."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as web:
        await signed_in(web, PAT)
        path = link.removeprefix(base)
        page = await web.get(path)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        done = await web.post(path, data={"csrf": csrf, "seq": str(seq), "decision": "approve"})
        assert done.status_code in (200, 303), done.text


async def approve_on_console(base: str, run_id: str, seq: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as web:
        await signed_in(web, PAT)
        page = await web.get(f"/console/runs/{run_id}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        done = await web.post(f"/console/runs/{run_id}/decide",
                              data={"csrf": csrf, "seq": str(seq), "decision": "approve"})
        assert done.status_code == 303, done.text


async def until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_p47_a_task_survives_a_restart_and_its_write_waits_for_a_signed_in_person(tether_url):
    """The run pauses; the server restarts; polling finds input_required with the approval link; the client's
    own approve sends nothing; a person approves on the link page; the client gets the result; sent once."""
    server = tether_url("auto")
    questions: list = []

    async def client_user(message, response_type, params, context):
        questions.append(params)
        return ElicitResult(action="accept", content={"decision": "approve"})  # the agent's side says yes

    async with Client(server.url, auth=AGENT, elicitation_handler=client_user, timeout=120) as client:
        task = await call_tool_task(client, "execute", {"code": guarded("t1")})
        assert task.create_result.status in ("working", "input_required")
        run_id = run_of(task)

        server.restart()

        parked = await task.wait(state="input_required", timeout=60)
        [(key, request)] = parked.input_requests.items()
        assert key == "approval:1" and request["method"] == "elicitation/create"
        link = ElicitRequestURLParams.model_validate(request["params"]).url
        assert link.startswith(f"{server.base}/approve/")
        assert "ledger.guarded_write" in request["params"]["message"] and "t1" in request["params"]["message"]

        drive = asyncio.ensure_future(task.result())
        await until(lambda: questions)
        # The client said yes; it decides nothing: the task waits on the page, and nothing was sent.
        await asyncio.sleep(1.0)
        status = await task.status()
        assert status.status == "working" and not drive.done() and server.tags() == []
        assert len(questions) == 1  # asked once, not again on every poll

        await approve_on_link(server.base, link, 1)
        result = await asyncio.wait_for(drive, 60)

    assert result.structured_content["status"] == "completed" and result.structured_content["result"] == "t1"
    assert server.tags() == ["t1"]
    run, events = server.run(run_id)
    decided = [e.data for e in events if e.type == "decided"]
    assert run.status == "completed" and [d.get("via") for d in decided] == ["link"]


async def test_p47_d72_a_form_approve_through_tasks_update_never_sends_a_signed_in_write(tether_url):
    """With forms, a write whose rule needs a signed-in approver asks the client nothing (working, saying where);
    an approve sent through tasks/update anyway is refused and recorded; a person approves on the console."""
    server = tether_url("form")

    async def never(message, response_type, params, context):
        raise AssertionError("a signed-in write must not be put to the client's form")

    async with Client(server.url, auth=AGENT, elicitation_handler=never, timeout=120) as client:
        task = await call_tool_task(client, "execute", {"code": guarded("t2")})
        run_id = run_of(task)
        status = await task.status()
        assert status.status == "working" and "/console/runs/" in (status.status_message or "")

        forged = UpdateTaskRequest(params=UpdateTaskRequestParams(
            task_id=task.task_id, input_responses={"approval:1": {"action": "accept",
                                                                  "content": {"decision": "approve"}}}))
        await client.session.send_request(forged, Result)
        await asyncio.sleep(1.0)
        assert server.tags() == [] and (await task.status()).status == "working"
        run, events = server.run(run_id)
        assert run.status == "paused"
        assert [e.data.get("refused") for e in events if e.type == "task_answered"] == ["approval_elsewhere"]

        drive = asyncio.ensure_future(task.result())
        await approve_on_console(server.base, run_id, 1)
        result = await asyncio.wait_for(drive, 60)
    assert result.structured_content["result"] == "t2" and server.tags() == ["t2"]


async def test_p47_a_decline_through_the_form_reaches_the_program_and_sends_nothing(tether_url):
    server = tether_url("form")
    forms: list = []

    async def user_says_no(message, response_type, params, context):
        forms.append(params)
        return ElicitResult(action="accept", content={"decision": "decline", "reason": "not today"})

    async with Client(server.url, auth=AGENT, elicitation_handler=user_says_no, timeout=120) as client:
        result = await client.call_tool("execute", {"code": asked_write("t3")})
    [form] = forms
    assert isinstance(form, ElicitRequestFormParams) and "ledger.write" in form.message
    assert result.structured_content["status"] == "completed"
    assert result.structured_content["result"].startswith("refused: ") and "not today" in result.structured_content["result"]
    assert server.tags() == []


async def test_p47_a_form_approve_is_taken_where_the_rule_allows_forms(tether_url):
    server = tether_url("form")

    async def user_says_yes(message, response_type, params, context):
        return {"decision": "approve"}

    async with Client(server.url, auth=AGENT, elicitation_handler=user_says_yes, timeout=120) as client:
        result = await client.call_tool("execute", {"code": asked_write("t4")})
        again = await client.call_tool("execute", {"code": "21 * 2"})
    assert result.structured_content["result"] == "t4" and server.tags() == ["t4"]
    # A run that ends within task_after_seconds answers the call directly, as without the extension.
    assert again.structured_content["result"] == 42


async def never_answered(message, response_type, params, context):
    raise AssertionError("not driven here: the test polls and decides itself")


async def test_p47_tasks_cancel_cancels_the_run_and_nothing_is_sent(tether_url):
    server = tether_url("form")
    async with Client(server.url, auth=AGENT, elicitation_handler=never_answered, timeout=120) as client:
        task = await call_tool_task(client, "execute", {"code": asked_write("t5")}, raise_on_error=False)
        assert (await task.status()).status == "input_required"
        await task.cancel()
        final = await task.wait(timeout=30)
        result = await task.result()
    assert final.status == "cancelled" and result.is_error
    run, _ = server.run(run_of(task))
    assert run.status == "cancelled" and server.tags() == []


# ledger.write allowed: a write goes on the wire without anyone asked.
ALLOWED = CONFIG.replace('match = "ledger.write"\naction = "ask"', 'match = "ledger.write"\naction = "allow"')


async def test_p8_tasks_cancel_while_a_write_is_on_the_wire_lets_it_finish_and_sends_nothing_further(tether_url):
    """tasks/cancel cuts no write: the one on the wire finishes and is journaled, the next is never sent; a
    cancel of the task once it has ended is acknowledged and changes nothing."""
    assert ALLOWED != CONFIG
    server = tether_url("form", ALLOWED)
    code = ("import tools\nawait tools.ledger.write(tag='w1', seconds=3)\n"
            "await tools.ledger.write(tag='w2')\n'done'")
    async with Client(server.url, auth=AGENT, elicitation_handler=never_answered, timeout=120) as client:
        task = await call_tool_task(client, "execute", {"code": code}, raise_on_error=False)
        await until(lambda: server.tags() == ["w1"])  # w1 is on the wire (it answers 3 s later)
        assert (await task.status()).status == "working"
        await task.cancel()
        final = await task.wait(timeout=30)
        assert final.status == "cancelled"
        await task.cancel()  # the task has ended: acknowledged, nothing changes
        assert (await task.status()).status == "cancelled"
    await asyncio.sleep(1.0)
    assert server.tags() == ["w1"]
    run, _ = server.run(run_of(task))
    store = open_store(f"sqlite:///{server.root / 'home' / 'tether.db'}")
    try:
        calls = [c for c in store.get_calls(run.run_id) if c.op == "tool"]
    finally:
        store.close()
    assert run.status == "cancelled"
    assert [(c.args.get("tag"), c.state, c.outcome) for c in calls] == [("w1", "sent", "w1")]


async def test_p8_a_call_dropped_before_it_became_a_task_lets_the_write_on_the_wire_finish(tether_url):
    """The client gives up on tools/call while its run's write is on the wire, before the call became a task:
    the run is cancelled, the write finishes and is journaled, and nothing further is sent."""
    server = tether_url("form", ALLOWED)
    code = ("import tools\nawait tools.ledger.write(tag='d1', seconds=3)\n"
            "await tools.ledger.write(tag='d2')\n'done'")
    async with Client(server.url, auth=AGENT, elicitation_handler=never_answered, timeout=120) as client:
        call = asyncio.ensure_future(call_tool_task(client, "execute", {"code": code}, raise_on_error=False))
        await until(lambda: server.tags() == ["d1"])  # on the wire; the call becomes a task only after 1 s
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    store = open_store(f"sqlite:///{server.root / 'home' / 'tether.db'}")
    try:
        deadline = time.monotonic() + 30
        while not (runs := store.list_runs()) or not all(r.status == "cancelled" for r in runs):
            assert time.monotonic() < deadline, [r.status for r in runs]
            await asyncio.sleep(0.2)
        [run] = runs
        calls = [c for c in store.get_calls(run.run_id) if c.op == "tool"]
    finally:
        store.close()
    await asyncio.sleep(1.0)
    assert server.tags() == ["d1"]
    assert [(c.args.get("tag"), c.state, c.outcome) for c in calls] == [("d1", "sent", "d1")]


async def test_p47_the_agent_signed_in_with_its_own_token_cannot_approve_its_tasks_link(tether_url):
    """The task puts a signed-in write as its approval link; the agent takes the link and signs in on the console
    with the very token that started the run: it cannot approve it there either, and nothing is sent."""
    server = tether_url("url")
    async with Client(server.url, auth=AGENT, elicitation_handler=never_answered, timeout=120) as client:
        task = await call_tool_task(client, "execute", {"code": guarded("t9")})
        parked = await task.wait(state="input_required", timeout=60)
        [(_, request)] = parked.input_requests.items()
        link = ElicitRequestURLParams.model_validate(request["params"]).url
        async with httpx.AsyncClient(base_url=server.base, timeout=30) as web:
            page = await web.get("/console/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            login = await web.post("/console/login", data={"csrf": csrf, "token": AGENT})
            assert login.status_code == 303  # signed in as the agent
            path = link.removeprefix(server.base)
            page = await web.get(path)
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            done = await web.post(path, data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert done.status_code == 403 and "nothing was sent" in done.text
        await asyncio.sleep(1.0)
        assert (await task.status()).status in ("input_required", "working")
    run, events = server.run(run_of(task))
    assert run.status == "paused" and server.tags() == []
    assert not [e for e in events if e.type == "decided"]


async def test_p47_another_principals_task_id_is_not_found(tether_url):
    server = tether_url("form")
    async with Client(server.url, auth=AGENT, elicitation_handler=never_answered, timeout=120) as mine:
        task = await call_tool_task(mine, "execute", {"code": asked_write("t6")})
        # The approver's own token (which may decide this run's writes on the console, never through the
        # agent's task) opens no MCP door at all (P-44): it is refused before any task is looked up.
        with pytest.raises(MCPError):
            async with Client(server.url, auth=PAT, elicitation_handler=never_answered, timeout=120) as theirs:
                await ToolTask(theirs, "execute", task.create_result).status()
        # Another agent's token.
        for token in (OTHER,):
            async with Client(server.url, auth=token, elicitation_handler=never_answered, timeout=120) as theirs:
                foreign = ToolTask(theirs, "execute", task.create_result)
                for attempt in (foreign.status(), foreign.cancel()):
                    with pytest.raises(MCPError, match="Task not found"):
                        await attempt
                forged = UpdateTaskRequest(params=UpdateTaskRequestParams(
                    task_id=task.task_id, input_responses={"approval:1": {"action": "accept",
                                                                          "content": {"decision": "approve"}}}))
                with pytest.raises(MCPError, match="Task not found"):
                    await theirs.session.send_request(forged, Result)
        # An altered id is no task either, even for the principal it was made for.
        run_id, _, mac = task.task_id.rpartition(".")
        altered = ToolTask(mine, "execute", task.create_result.model_copy(update={"task_id": f"{run_id}.{mac[::-1]}"}))
        with pytest.raises(MCPError, match="Task not found"):
            await altered.status()
        assert (await task.status()).status == "input_required"
    run, _ = server.run(run_of(task))
    assert run.status == "paused" and server.tags() == []


async def test_p47_a_client_without_the_extension_sees_no_task(tether_url):
    """The official SDK's client declares no tasks extension: execute answers as it always has (P-27)."""
    import httpx2
    from mcp import Client as SdkClient
    from mcp.client.streamable_http import streamable_http_client

    server = tether_url("form")

    async def approve(context, params):
        return ElicitResult(action="accept", content={"decision": "approve"})

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {AGENT}"}, timeout=60) as http:
        async with SdkClient(streamable_http_client(server.url, http_client=http), mode="auto",
                             elicitation_callback=approve) as client:
            result = await client.call_tool("execute", {"code": asked_write("t7")})
    assert result.structured_content["result"] == "t7" and server.tags() == ["t7"]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_p47_a_task_on_a_replica_that_dies_is_finished_on_another(tmp_path, backend, request):
    """Two replicas on one store (SQLite, Postgres). A run becomes a task on the first, which is SIGKILLed
    mid-program; the second takes the run over, and the client, now talking to it with the same task id,
    answers the write's question and gets the result. The write is sent once."""
    root = tmp_path / "rs"
    store_url = f"sqlite:///{tmp_path / 'store.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    rs = ReplicaSet(root, store_url, 2,
                    server_extra='approvals = "form"\ntask_after_seconds = 1', lease_seconds=3)
    code = ("import tools\nawait tools.ledger.wait(seconds=3)\n"
            "await tools.ledger.guarded_write(tag='r1')\n'done'")
    dying, survivor = rs.replicas

    async def user_says_yes(message, response_type, params, context):
        return {"decision": "approve"}

    async def scenario() -> tuple:
        async with Client(dying.url, timeout=120) as first:
            task = await call_tool_task(first, "execute", {"code": code})
            assert (await task.status()).status == "working"
            create = task.create_result
        dying.proc.send_signal(signal.SIGKILL)
        dying.proc.wait(timeout=10)
        async with Client(survivor.url, elicitation_handler=user_says_yes, timeout=120) as second:
            return create, await ToolTask(second, "execute", create).result()

    try:
        create, result = asyncio.run(scenario())
        assert result.structured_content["status"] == "completed" and result.structured_content["result"] == "done"
        assert rs.tags() == ["r1"]
        store = open_store(store_url)
        try:
            run = store.get_run(create.task_id.rpartition(".")[0])
            assert run.status == "completed"
        finally:
            store.close()
    finally:
        rs.stop()


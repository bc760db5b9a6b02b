"""A decision the console or a link answered "queued" for, refused when its turn came, is told where the person
looks: the run's page and the link's page say it was not taken, with the code and message (P-51).

The console and approval links answer at once and decide in the background once the run owner's slot is free
(D-74); here the slot is held while another person cancels the run. Over the console's ASGI app (httpx), on
SQLite, with the real notes tools.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import httpx
import pytest

from tether._app import open_runtime
from tether._engine.approvals import APPROVE, Access, Grant
from tether._server.admission import Admission
from tether._server.approvals import REFUSED_EVENT, Decider, link_token, refused_decisions
from tether._server.auth import principal_for_token
from tether._server.console import Console
from tether.errors import NotPaused

TOOLS = str(Path(__file__).parent.parent / "fixtures" / "notes_tools.py")
ONE = "import tools\nawait tools.notes.add_note(text='hello')\n'sent'"
PAT = "pat-token-0123456789abc"
OWNER = principal_for_token("alice-token-0123456789")


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TETHER_STORE_URL", f"sqlite:///{tmp_path}/tether.db")
    monkeypatch.setenv("NOTES_FILE", str(tmp_path / "notes.jsonl"))
    monkeypatch.delenv("TETHER_TOKEN", raising=False)
    return tmp_path


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


class Served:
    def __init__(self, rt, admission: Admission) -> None:
        self.rt = rt
        self.decider = Decider(rt, admission=admission, settle_seconds=0.2)
        console = Console(rt, tokens=[PAT], decider=self.decider, access=Access.of(
            [Grant(principal_for_token(PAT), "pat", frozenset({APPROVE}), frozenset({"*"}))]))
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app),
                                      base_url="http://127.0.0.1:8000")

    async def sign_in(self) -> str:
        page = await self.http.get("/console/login")
        await self.http.post("/console/login", data={"csrf": csrf_of(page.text), "token": PAT})
        return csrf_of((await self.http.get("/console/")).text)

    async def background(self) -> BaseException | None:
        """The queued decision, once its slot freed: the exception it ended with."""
        (task,) = list(self.decider._tasks)
        try:
            await task
        except BaseException as exc:  # noqa: BLE001 - what the person is to be told
            return exc
        return None


async def test_p51_a_console_approval_queued_then_refused_is_shown_on_the_run_page(store_env):
    admission = Admission(1, 5, 30.0)
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        served = Served(rt, admission)
        csrf = await served.sign_in()
        paused = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        held = await admission.acquire(OWNER)
        try:
            r = await served.http.post(f"/console/runs/{paused.run_id}/decide",
                                       data={"csrf": csrf, "seq": "1", "decision": "approve"})
            assert r.status_code == 303 and "flash=queued" in r.headers["location"], r.text
            back = r.headers["location"]
            assert "waits for a free run slot" in text_of((await served.http.get(back)).text)
            await rt.cancel(paused.run_id, "wrong customer", principal=OWNER)
        finally:
            held.release()
        refused = await served.background()
        assert isinstance(refused, NotPaused)
        # The page the person was sent back to, reloaded: their approval was not taken, and why.
        page = text_of((await served.http.get(back)).text)
        assert "A decision was not taken: approve of call 1 by token “pat” via console" in page, page
        assert f"[not_paused] {refused.message}" in page and "waits for a free run slot" not in page
        assert "was cancelled by" in refused.message and "call 1 notes.add_note was not sent" in refused.message
        # What is kept is what the page shows, no more (no origin, no typed reason).
        (event,) = [e for e in rt.store.get_events(paused.run_id) if e.type == REFUSED_EVENT]
        assert event.data == {"seqs": [1], "decision": "approve", "actor": "token “pat”", "via": "console",
                              "code": "not_paused", "message": refused.message}
        assert rt.store.get_call(paused.run_id, 1).state == "declined" and not (store_env / "notes.jsonl").exists()
        await served.decider.close()
        await served.http.aclose()


async def test_p51_a_link_approval_queued_then_refused_is_shown_when_the_link_is_opened_again(store_env):
    admission = Admission(1, 5, 30.0)
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        served = Served(rt, admission)
        csrf = await served.sign_in()
        paused = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        token = link_token(rt.store.secret(), paused.run_id, 1, paused.expires_at)
        held = await admission.acquire(OWNER)
        try:
            r = await served.http.post(f"/approve/{token}", data={"csrf": csrf, "seq": "1", "decision": "approve"})
            assert r.status_code == 202 and "waits for a free run slot" in text_of(r.text), r.text
            await rt.cancel(paused.run_id, "wrong customer", principal=OWNER)
        finally:
            held.release()
        refused = await served.background()
        assert isinstance(refused, NotPaused)
        again = await served.http.get(f"/approve/{token}")
        page = text_of(again.text)
        assert again.status_code == 409 and "Your decision was not taken" in page, page
        assert f"[not_paused] {refused.message}" in page and "The run is cancelled." in page
        await served.decider.close()
        await served.http.aclose()


async def test_p51_nothing_is_kept_for_a_queued_decision_taken_nor_for_a_refusal_the_page_showed(store_env):
    admission = Admission(1, 5, 30.0)
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        served = Served(rt, admission)
        csrf = await served.sign_in()
        taken = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        held = await admission.acquire(OWNER)
        try:
            r = await served.http.post(f"/console/runs/{taken.run_id}/decide",
                                       data={"csrf": csrf, "seq": "1", "decision": "approve"})
            assert "flash=queued" in r.headers["location"]
        finally:
            held.release()
        assert await served.background() is None
        assert (await rt.engine.wait_for_run(taken.run_id)).status == "completed"
        assert "not taken" not in text_of((await served.http.get(r.headers["location"])).text)
        # Refused at once (the run was cancelled before the form was posted): the answer says it, nothing is kept.
        late = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        await rt.cancel(late.run_id, "stop", principal=OWNER)
        r = await served.http.post(f"/console/runs/{late.run_id}/decide",
                                   data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert r.status_code == 409 and "(not_paused)" in r.text
        for run in (taken, late):
            assert refused_decisions(rt.store.get_events(run.run_id)) == []
        await served.decider.close()
        await served.http.aclose()


async def test_p51_a_refusal_is_no_longer_shown_once_the_same_decision_was_taken_after_it(store_env):
    """A refusal that left the write waiting (here stored as the Decider stores it) shows on the run's page until
    the person decides again and it is taken."""
    async with open_runtime(tools=[TOOLS], type_check=False) as rt:
        served = Served(rt, Admission(1, 5, 30.0))
        csrf = await served.sign_in()
        paused = await rt.execute(ONE, principal=OWNER, meta={"tools": [TOOLS]})
        await rt.engine.events.emit_awaited(paused.run_id, REFUSED_EVENT, {
            "seqs": [1], "decision": "approve", "actor": "token “pat”", "via": "console",
            "code": "tools_unavailable", "message": "the notes server did not start; nothing was decided"})
        page = text_of((await served.http.get(f"/console/runs/{paused.run_id}")).text)
        assert "[tools_unavailable] the notes server did not start" in page
        r = await served.http.post(f"/console/runs/{paused.run_id}/decide",
                                   data={"csrf": csrf, "seq": "1", "decision": "approve"})
        assert r.status_code == 303
        assert (await rt.engine.wait_for_run(paused.run_id)).status == "completed"
        assert "not taken" not in text_of((await served.http.get(f"/console/runs/{paused.run_id}")).text)
        await served.decider.close()
        await served.http.aclose()

"""The secret rotated across replicas without breaking in-flight pauses (docs/security.md, P-35, P-18).

Three runtimes with stores of their own on one Postgres stand for replicas
started one after another as the operator rotates ``TETHER_SECRET_FILE``:
old only; new first with old kept (verifies only); new only.
"""

from __future__ import annotations

import httpx2
import pytest

from helpers import Recorder
from tether._engine.approvals.capabilities import secret_id
from tether._engine.waits import parse_wait_key
from tether._runtime import Runtime
from tether._server.approvals import link_token, open_token
from tether._store import open_store
from tether.errors import WrongSecret

OLD, NEW = "a1" * 32, "b2" * 32
OLD_KEY, NEW_KEY = bytes.fromhex(OLD), bytes.fromhex(NEW)

CLOSE = "import tools\nc = await tools.helpdesk.close_ticket(id=ID)\nc['status']"
WAIT = 'v = await wait_for("go")\n["got", v]'
SESSION = 'x = 41'
SESSION_NEXT = 'v = await wait_for("more")\nx + v'


@pytest.fixture
def replica(pg_url, tmp_path, monkeypatch):
    opened: list[Runtime] = []

    def start(*secrets: str, rec: Recorder) -> Runtime:
        path = tmp_path / f"secrets-{len(opened)}"
        path.write_text("# current first, older ones only verify\n" + "\n".join(secrets) + "\n")
        monkeypatch.setenv("TETHER_SECRET_FILE", str(path))
        rt = Runtime(store=open_store(pg_url), tools=rec.tools(), type_check=False)
        opened.append(rt)
        return rt

    return start


async def test_pauses_waits_links_and_sessions_survive_a_rotation_and_removing_the_old_secret_says_so(replica):
    rec = Recorder()
    async with replica(OLD, rec=rec) as a:
        approved = await a.execute(CLOSE.replace("ID", "1"))
        parked = await a.execute(WAIT)
        in_session = await a.execute(SESSION, session="s-rotation")
        assert in_session.status == "completed"
        in_session = await a.execute(SESSION_NEXT, session="s-rotation")
        left_paused = await a.execute(CLOSE.replace("ID", "2"))
        left_parked = await a.execute(WAIT)
    assert [r.status for r in (approved, parked, in_session, left_paused, left_parked)] == \
        ["paused", "waiting", "waiting", "paused", "waiting"]
    link = link_token(OLD_KEY, approved.run_id, approved.pending["seq"], approved.expires_at)

    # Rotated: the new secret signs, the old one only verifies. Everything handed out before works.
    async with replica(NEW, OLD, rec=rec) as b:
        claim = open_token([b.engine.keyring.current, *b.engine.keyring.previous], link)
        assert claim is not None and claim.run_id == approved.run_id
        done = await b.resolve_wait(approved.pending["key"], {"decision": "approve"})
        assert done["status"] == "accepted" and done["run"]["status"] == "completed", done
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        done = await b.resolve_wait(parked.pending["key"], "yes")
        assert done["run"]["status"] == "completed" and done["run"]["result"] == ["got", "yes"], done
        # A run parked in a session before the rotation restores its session's globals.
        done = await b.resolve_wait(in_session.pending["key"], 1)
        assert done["run"]["status"] == "completed" and done["run"]["result"] == 42, done
        # What is made now is made with the new secret only.
        fresh = await b.execute(WAIT)
        assert parse_wait_key(NEW_KEY, fresh.pending["key"]) is not None
        assert parse_wait_key(OLD_KEY, fresh.pending["key"]) is None
        snapshot = b.store.latest_snapshot(fresh.run_id)
        assert snapshot.mac.split(":")[0] == secret_id(NEW_KEY)
        assert b.store.get_run(fresh.run_id).mac["secret_id"] == secret_id(NEW_KEY)
        # The wait a run made before the rotation keeps its key when the run comes back to it.
        assert b.engine.waits.key(left_parked.run_id, "go") == left_parked.pending["key"]

    # The old secret removed: what only it signed is refused by name; nothing is sent or changed.
    async with replica(NEW, rec=rec) as c:
        with pytest.raises(WrongSecret) as refused:
            await c.resolve_wait(left_parked.pending["key"], "late")
        assert refused.value.code == "wrong_secret"
        with pytest.raises(WrongSecret):
            await c.resume(left_paused.run_id, "approve", seq=left_paused.pending["seq"])
        assert rec.deliveries == [("close_ticket", {"id": 1})]
        assert c.store.get_run(left_paused.run_id).status == "paused"
        assert c.store.get_run(left_parked.run_id).status == "waiting"
        assert open_token([c.engine.keyring.current], link) is None
        # What the new secret made goes on.
        done = await c.resolve_wait(fresh.pending["key"], "new")
        assert done["run"]["status"] == "completed" and done["run"]["result"] == ["got", "new"], done


class Switch(httpx2.AsyncBaseTransport):
    """Every request to the first replica until ``switch()``, then to the second."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.to = ports, 0
        self.inner = httpx2.AsyncHTTPTransport()

    def switch(self) -> None:
        self.to = 1

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(port=self.ports[self.to])
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.slow
async def test_request_state_sealed_before_a_rotation_opens_on_a_rotated_replica(pg_url, tmp_path):
    """A 2026-07-28 input-required round trip: asked by a replica on the old secret, answered to one
    that put the new secret first and kept the old; the write is sent once."""
    from mcp_types import ElicitResult

    from replicas import ReplicaSet, connect

    old_only, rotated = tmp_path / "old", tmp_path / "rotated"
    old_only.write_text(OLD + "\n")
    rotated.write_text(f"{NEW}\n{OLD}\n")
    rs = ReplicaSet(tmp_path / "replicas", pg_url, 2, env_of={0: {"TETHER_SECRET_FILE": str(old_only)},
                                                             1: {"TETHER_SECRET_FILE": str(rotated)}})
    try:
        route = Switch([r.port for r in rs.replicas])

        async def approve_on_the_other(context, params):
            route.switch()  # the retry carrying the answer (and the sealed state) goes to the rotated replica
            return ElicitResult(action="accept", content={"decision": "approve"})

        code = "import tools\nawait tools.ledger.guarded_write(tag='rotated-state')"
        async with connect(rs.replicas[0].url, "auto", transport=route,
                           elicitation_callback=approve_on_the_other) as client:
            r = await client.call_tool("execute", {"code": code})
        assert r.structured_content["status"] == "completed", r.content[0].text
        assert route.to == 1 and rs.tags().count("rotated-state") == 1
    finally:
        rs.stop()

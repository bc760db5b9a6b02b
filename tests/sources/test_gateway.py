"""tether as a gateway: real upstream MCP servers as tool sources, configured in tether.toml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli
from tether._app import open_runtime
from tether._config import load_config

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "tether@example.com")
    git(repo, "config", "user.name", "tether")
    (repo / "README.md").write_text("hello\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "initial")
    return repo


def write_config(tmp_path: Path, repo: Path) -> Path:
    config = tmp_path / "tether.toml"
    config.write_text(
        f"""
[store]
url = "sqlite:///{tmp_path}/tether.db"

[[sources]]
type = "mcp"
namespace = "git"
command = ["{BIN / 'mcp-server-git'}", "--repository", "{repo}"]

[[sources]]
type = "mcp"
namespace = "clock"
command = ["{BIN / 'mcp-server-time'}"]

[[sources]]
type = "mcp"
namespace = "broken"
command = ["{BIN / 'no-such-server'}"]
"""
    )
    return config


async def test_a_commit_through_mcp_server_git_is_paused_approved_and_made_once(tmp_path, repo):
    config = write_config(tmp_path, repo)
    (repo / "notes.txt").write_text("written by a program\n")
    program = f"""
import tools
status = await tools.git.git_status(repo_path={str(repo)!r})
now = await tools.clock.get_current_time(timezone="UTC")
await tools.git.git_add(repo_path={str(repo)!r}, files=["notes.txt"])
await tools.git.git_commit(repo_path={str(repo)!r}, message="tether: add notes")
log = await tools.git.git_log(repo_path={str(repo)!r})
{{"untracked_before": "notes.txt" in str(status), "log": str(log)}}
"""
    async with open_runtime(load_config(config)) as rt:
        statuses = {s.name: s for s in rt.engine.sources.statuses()}
        assert statuses["git"].ok and statuses["clock"].ok
        assert not statuses["broken"].ok and statuses["broken"].error  # reported, not fatal
        r = await rt.execute(program, type_check=False)
        assert r.status == "paused" and r.pending["address"] == "git.git_add"
        r = await rt.resume(r.run_id, "approve", seq=r.pending["seq"])
        assert r.status == "paused" and r.pending["address"] == "git.git_commit"
        commit_seq = r.pending["seq"]
        assert "tether: add notes" not in git(repo, "log", "--oneline")  # not before approval
        run_id = r.run_id
    # Approve from another runtime (another process would do the same): the
    # upstream server is started again by the new runtime.
    async with open_runtime(load_config(config)) as rt2:
        done = await rt2.resume(run_id, "approve", seq=commit_seq)
        assert done.status == "completed", done.error
        assert done.result["untracked_before"] is True
        again = await rt2.resume(run_id, "approve", seq=commit_seq)
        assert again.result == done.result
    log = git(repo, "log", "--format=%s")
    assert log.splitlines().count("tether: add notes") == 1


def test_sources_list_shows_what_loaded_and_what_failed(tmp_path, repo):
    config = write_config(tmp_path, repo)
    env = dict(os.environ, TETHER_HOME=str(tmp_path / "home"))
    r = run_cli(["--config", str(config), "sources", "list", "--json"], env, tmp_path)
    assert r.returncode == 1  # one source failed
    out = json.loads(r.stdout)
    by_name = {s["source"]: s for s in out["sources"]}
    assert by_name["git"]["ok"] and by_name["git"]["tools"] >= 5
    assert by_name["clock"]["ok"] and by_name["clock"]["tools"] == 2
    assert not by_name["broken"]["ok"] and "no-such-server" in by_name["broken"]["error"]
    assert {n["namespace"] for n in out["namespaces"] if n["tools"]} == {"git", "clock"}
    # The failed source is listed too, with its error, so a program is not left guessing.
    (broken,) = [n for n in out["namespaces"] if not n["tools"]]
    assert broken["namespace"] == "broken" and "no-such-server" in broken["error"]


async def test_a_namespace_the_sandbox_keeps_is_refused_with_a_named_error(tmp_path):
    config = tmp_path / "tether.toml"
    config.write_text(f'[[sources]]\ntype = "mcp"\nnamespace = "time"\ncommand = ["{BIN / "mcp-server-time"}"]\n')
    async with open_runtime(load_config(config)) as rt:
        (status,) = rt.engine.sources.statuses()
        assert not status.ok and "namespace_reserved" in status.error and "tools.time" in status.error

"""Sources as a user configures them: failures are loud and bounded, start-up stays fast.

Real MCP servers (mcp-server-time from PyPI, the fixture server) and a hung
one (`sleep`); commands through ``main()`` in this process, `serve` and
`worker` (and the start-up probe) in processes of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli
from tether._sources._mcp_tools import TASK_REQUIRED, build_tools

FIXTURES = Path(__file__).parent.parent / "fixtures"
TETHER = [sys.executable, "-m", "tether.cli"]
BIN = Path(sys.executable).parent


def _mcp(namespace: str, command: list[str], extra: str = "") -> str:
    return f'[[sources]]\ntype = "mcp"\nnamespace = "{namespace}"\ncommand = {json.dumps(command)}\n{extra}\n'


@pytest.fixture
def project(tmp_path):
    home = tmp_path / "home"
    env = dict(os.environ, TETHER_HOME=str(home))
    env.pop("TETHER_STORE_URL", None)
    return tmp_path, home, env


def tether(args, env, cwd, timeout=120):
    """In its own process."""
    return subprocess.run(TETHER + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def cli(args, env, cwd):
    """In this process (each command opens its own runtime, as a process would)."""
    return run_cli(args, env, cwd)


@pytest.mark.slow
def test_a_hung_source_is_reported_bounded_and_unavailable_not_unknown(project):
    cwd, home, env = project
    (cwd / "tether.toml").write_text(
        _mcp("hung", ["sleep", "1000"], "start_timeout = 1")
        + _mcp("fx", [sys.executable, str(FIXTURES / "mcp_fixture_server.py")]))
    (cwd / "listed.py").write_text("await sources()\n")
    listed = cli(["run", "listed.py", "--json"], env, cwd)
    assert listed.returncode == 0, listed.stderr
    # One line on stderr: which source, where it is configured, why.
    lines = [ln for ln in listed.stderr.splitlines() if "hung" in ln]
    assert len(lines) == 1
    assert "tether.toml: sources[0]" in lines[0] and "start_timeout" in lines[0]
    namespaces = {s["namespace"]: s for s in json.loads(listed.stdout)["result"]}
    assert namespaces["fx"]["tools"] > 0
    assert namespaces["hung"]["tools"] == 0 and "did not start within 1 s" in namespaces["hung"]["error"]

    (cwd / "call.py").write_text("import tools\nawait tools.hung.anything()\n")
    called = cli(["run", "call.py", "--json", "--no-check"], env, cwd)
    assert called.returncode == 1
    assert json.loads(called.stdout)["error"]["code"] == "source_unavailable"


@pytest.mark.slow
def test_upstream_stderr_goes_to_a_log_and_listings_come_from_the_cache(project):
    cwd, home, env = project
    (cwd / "tether.toml").write_text(
        _mcp("fx", [sys.executable, str(FIXTURES / "mcp_fixture_server.py")])
        + _mcp("clock", [str(BIN / "mcp-server-time")]))
    (cwd / "one.py").write_text("1 + 1\n")
    log = home / "logs" / "fx.log"

    first = cli(["run", "one.py"], env, cwd)
    assert first.returncode == 0 and first.stdout.strip() == "2", first.stderr
    assert "starting on stdio" not in first.stderr  # the server's banner is not the user's business
    assert log.read_text().count("starting on stdio") == 1  # started once, to list its tools

    again = cli(["run", "one.py"], env, cwd)
    assert again.returncode == 0
    assert log.read_text().count("starting on stdio") == 1  # listing from the cache: not started
    # Nor is the MCP client stack imported (about a second) for a program that calls no MCP tool.
    probe = ("import asyncio, sys\nfrom tether._app import open_runtime\n"
             "async def main():\n    async with open_runtime() as rt:\n"
             "        assert (await rt.execute('1 + 1')).result == 2\n"
             "    print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))\n"
             "asyncio.run(main())\n")
    probed = subprocess.run([sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    assert probed.returncode == 0 and probed.stdout.strip() == "[]", probed.stdout + probed.stderr

    # A program that calls the server starts it then, and only it.
    (cwd / "echo.py").write_text("import tools\nawait tools.fx.echo(text='hi')\n")
    echoed = cli(["run", "echo.py", "--json"], env, cwd)
    assert json.loads(echoed.stdout)["result"] == {"result": "hi"}, echoed.stderr
    assert log.read_text().count("starting on stdio") == 2

    # A real third-party server from its cached listing, called for real.
    (cwd / "now.py").write_text("import tools\nawait tools.clock.get_current_time(timezone='UTC')\n")
    now = cli(["run", "now.py", "--json"], env, cwd)
    assert now.returncode == 0, now.stdout + now.stderr
    assert "UTC" in json.dumps(json.loads(now.stdout)["result"])

    refreshed = cli(["sources", "refresh"], env, cwd)
    assert refreshed.returncode == 0, refreshed.stderr
    assert log.read_text().count("starting on stdio") == 3


@pytest.mark.slow
def test_sources_list_prints_skipped_operations(project):
    cwd, home, env = project
    (cwd / "tether.toml").write_text(
        f'[[sources]]\ntype = "openapi"\nnamespace = "api"\nspec = "{FIXTURES / "openapi_problems.json"}"\n'
        'base_url = "http://127.0.0.1:9"\n')
    listed = cli(["sources", "list"], env, cwd)
    assert "skipped" in listed.stdout, listed.stdout + listed.stderr
    assert "tether.toml: sources[0]" in listed.stdout


def test_tools_that_require_task_augmentation_are_not_offered_and_say_why():
    listing = [
        {"name": "quick", "inputSchema": {"type": "object"}},
        {"name": "long_job", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}},
        {"name": "either", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}},
    ]
    tools, upstream, problems = build_tools("ns", listing, lambda name, wire: None)
    assert [t.name for t in tools] == ["quick", "either"]
    assert problems == [{"operation": "long_job", "problem": TASK_REQUIRED}]


async def test_an_openapi_description_in_yaml_loads_out_of_the_box(tmp_path):
    import yaml

    from tether._sources.openapi import OpenAPISource

    doc = json.loads((FIXTURES / "openapi_users.json").read_text())
    spec = tmp_path / "users.yaml"
    spec.write_text(yaml.safe_dump(doc))
    from_yaml = OpenAPISource("users", spec=str(spec), base_url="http://127.0.0.1:9")
    from_json = OpenAPISource("users", spec=str(FIXTURES / "openapi_users.json"), base_url="http://127.0.0.1:9")
    async with from_yaml, from_json:
        assert sorted(t.address for t in from_yaml.tools()) == sorted(t.address for t in from_json.tools())
        assert from_yaml.tools()


@pytest.mark.slow
def test_a_tool_defined_in_the_script_being_run_takes_the_scripts_stem(tmp_path):
    script = tmp_path / "weather_tools.py"
    script.write_text(
        "import asyncio\n"
        "from tether import Runtime, tool\n\n"
        "@tool(read_only=True)\n"
        "async def forecast(city: str) -> str:\n"
        "    '''The forecast.'''\n"
        "    return f'sun in {city}'\n\n"
        "async def main():\n"
        "    async with Runtime(tools=[forecast], type_check=False) as rt:\n"
        "        r = await rt.execute(\"import tools\\nawait tools.weather_tools.forecast(city='Oslo')\")\n"
        "        print(r.result)\n\n"
        "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sun in Oslo"

    inline = subprocess.run(
        [sys.executable, "-c", "from tether import Runtime, tool\n"
         "@tool\nasync def f() -> int:\n    '''x'''\n    return 1\nRuntime(tools=[f])\n"],
        capture_output=True, text=True, timeout=120)
    assert inline.returncode != 0
    assert "@tool(namespace=...)" in inline.stderr and "__main__" in inline.stderr


@pytest.mark.slow
def test_an_mcp_namespace_keeps_its_summary_when_listed_from_the_cache(project):
    cwd, home, env = project
    (cwd / "tether.toml").write_text(_mcp("fx", [sys.executable, str(FIXTURES / "mcp_fixture_server.py")]))
    (cwd / "listed.py").write_text("[(s['namespace'], s['summary']) for s in await sources()]\n")
    started = cli(["run", "listed.py", "--json"], env, cwd)
    cached = cli(["run", "listed.py", "--json"], env, cwd)  # the server is not started this time
    assert json.loads(started.stdout)["result"] == [["fx", "tether-fixture"]], started.stderr
    assert json.loads(cached.stdout)["result"] == [["fx", "tether-fixture"]], cached.stderr
    prompt = cli(["prompt"], env, cwd)
    assert "fx (" in prompt.stdout and "): tether-fixture\n" in prompt.stdout


@pytest.mark.slow
def test_sources_list_names_a_failed_source_beside_the_summaries(project):
    cwd, home, env = project
    (cwd / "tether.toml").write_text(
        _mcp("fx", [sys.executable, str(FIXTURES / "mcp_fixture_server.py")])
        + _mcp("broken", ["no-such-server-for-tether-tests"]))
    listed = cli(["sources", "list"], env, cwd)
    assert listed.returncode == 1  # a source failed: said, not hidden
    assert "  fx (" in listed.stdout and "): tether-fixture" in listed.stdout
    assert "  broken (0 tools): unavailable: " in listed.stdout


@pytest.mark.slow
def test_serve_and_worker_report_a_failed_source_on_stderr(project):
    cwd, home, env = project
    (cwd / "tether.toml").write_text(_mcp("broken", ["/nonexistent/tether-no-such-server"]))
    served = tether(["serve", "--stdio"], env, cwd)  # stdin closes at once: the server stops
    worked = tether(["worker", "--idle-exit", "0.2"], env, cwd)
    for proc in (served, worked):
        lines = [ln for ln in proc.stderr.splitlines() if "broken" in ln]
        assert len(lines) == 1, proc.stderr
        assert "tether.toml: sources[0]" in lines[0] and "not found" in lines[0]

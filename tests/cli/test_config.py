"""tether.toml: defaults, a full file, one clear error per bad key, env overrides."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tether._config import Config, load_config
from tether._engine.rules.limits import Limits
from tether._engine.rules.policy import Policy, Rule
from tether._sources.kinds import (
    MCPSourceDefinition,
    OpenAPISourceDefinition,
    PythonSourceDefinition,
    SourceBearerAuth,
    SourceQueryAuth,
)
from tether.errors import ConfigError

FULL = """
[limits]
code_bytes = 1000
memory_bytes = 1048576
run_seconds = 2.5
host_calls = 7
call_timeout_seconds = 3
result_bytes = 500
log_bytes = 600
recursion_depth = 200

[policy]
writes = "deny"
write_budget = 3
rules = [
  { match = "helpdesk.close_*", action = "ask" },
  { match = "helpdesk.*", action = "allow" },
]
approval_ttl_seconds = 3600
checkpoint_every_calls = 5
checkpoint_every_seconds = 1.5

[store]
url = "postgresql://tether:hunter2@db.internal/tether"

[sandbox]
min_workers = 2
max_workers = 4
type_check = false

[server]
host = "0.0.0.0"
port = 9000
token = "file-token"
allow_unauthenticated_loopback = true
queue_depth = 0
queue_timeout_seconds = 2

[[sources]]
type = "python"
module = "tether.demo.helpdesk"

[[sources]]
type = "python"
module = "_tools/local.py"
namespace = "local"

[[sources]]
type = "mcp"
namespace = "time"
command = ["mcp-server-time", "--local-timezone", "UTC"]
env = { TZ = "UTC", API_KEY = "s3cret" }
cwd = "servers"

[[sources]]
type = "mcp"
namespace = "remote"
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer abc" }

[[sources]]
type = "openapi"
namespace = "petstore"
spec = "specs/petstore.json"
base_url = "https://petstore.example.com/v1"
auth = { type = "bearer", token_env = "PETSTORE_TOKEN" }

[[sources]]
type = "openapi"
namespace = "weather"
spec = "https://weather.example.com/openapi.json"
auth = { type = "query", name = "appid", value_env = "WEATHER_KEY" }
"""


def write(tmp_path: Path, text: str, name: str = "tether.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    """The error lines a bad file produces (file name included)."""
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), env=env or {})
    assert caught.value.code == "config_invalid"
    return str(caught.value.message).splitlines()


def one_problem(tmp_path: Path, text: str) -> str:
    lines = problems(tmp_path, text)
    assert len(lines) == 1, lines
    return lines[0].split(": ", 1)[1]  # drop the file name


# --- defaults -----------------------------------------------------------------


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={})
    assert config.path is None
    assert config.home == tmp_path.resolve() / ".tether"
    assert config.store.url == f"sqlite:///{tmp_path.resolve()}/.tether/tether.db"
    assert (config.limits.code_bytes, config.limits.memory_bytes) == (65536, 64 * 1024 * 1024)
    assert (config.limits.run_seconds, config.limits.host_calls, config.limits.call_timeout_seconds) == (60, 50, 15)
    assert (config.limits.result_bytes, config.limits.log_bytes, config.limits.recursion_depth) == (30000, 30000, 1000)
    assert config.policy.writes == "ask"
    assert config.policy.write_budget == 10
    assert config.policy.rules == ()
    assert config.policy.approval_ttl_seconds == 86400
    assert (config.policy.checkpoint_every_calls, config.policy.checkpoint_every_seconds) == (100, 30)
    assert (config.sandbox.min_workers, config.sandbox.max_workers, config.sandbox.check) == (1, 2, "calls")
    assert config.sandbox.type_check is None  # the older switch, unset
    assert (config.server.host, config.server.port, config.server.token) == ("127.0.0.1", 8765, None)
    assert config.server.allow_unauthenticated_loopback is False
    assert config.server.max_concurrent_runs == config.sandbox.max_workers
    assert (config.server.queue_depth, config.server.queue_timeout_seconds) == (16, 10)
    assert config.sources == []
    assert config.secret is None


def test_reads_tether_toml_from_cwd_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "[limits]\nhost_calls = 9\n")
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={})
    assert config.limits.host_calls == 9
    assert config.path == tmp_path.resolve() / "tether.toml"


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), env={}).limits == Config().limits


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    with pytest.raises(ValidationError, match="frozen"):
        config.limits = Limits()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.limits.host_calls = 1000  # type: ignore[misc]


def test_limits_and_policy_parse_into_the_engines_own_types(tmp_path: Path) -> None:
    """One declaration each: what [limits] and [policy] parse into is what a Runtime runs with."""
    config = load_config(write(tmp_path, '[limits]\nhost_calls = 9\n[policy]\nwrites = "allow"\n'), env={})
    assert type(config.limits) is Limits and config.limits == Limits(host_calls=9)
    assert isinstance(config.policy, Policy) and config.policy.recorded() == Policy(writes="allow")
    # Built in Python, a value is checked by the same field types as the file's key.
    with pytest.raises(ValidationError, match="host_calls"):
        Limits(host_calls=0)
    with pytest.raises(ValidationError, match="glob"):
        Rule("helpdesk", "ask")


# --- a full valid file --------------------------------------------------------


def test_full_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), env={"TETHER_HOME": str(tmp_path / "home")})
    assert config.limits.run_seconds == 2.5
    assert config.limits.host_calls == 7
    assert config.limits.recursion_depth == 200
    assert config.policy.writes == "deny"
    assert config.policy.rules == (
        Rule(match="helpdesk.close_*", action="ask"),
        Rule(match="helpdesk.*", action="allow"),
    )
    assert config.store.url.startswith("postgresql://")
    assert config.sandbox.type_check is False
    # Not set in the file, so it follows the sandbox.
    assert config.server.max_concurrent_runs == 4
    assert config.server.queue_depth == 0
    assert config.server.token == "file-token"

    helpdesk, local, time, remote, petstore, weather = config.sources
    assert isinstance(helpdesk, PythonSourceDefinition)
    assert helpdesk.module == "tether.demo.helpdesk" and helpdesk.namespace is None
    # Paths are relative to the config file, not the working directory.
    assert isinstance(local, PythonSourceDefinition) and local.module == str(tmp_path.resolve() / "_tools/local.py")
    assert isinstance(time, MCPSourceDefinition) and time.command == ["mcp-server-time", "--local-timezone", "UTC"]
    assert time.cwd == str(tmp_path.resolve() / "servers")
    assert isinstance(remote, MCPSourceDefinition) and remote.url == "https://mcp.example.com/mcp"
    assert isinstance(petstore, OpenAPISourceDefinition) and petstore.spec == str(tmp_path.resolve() / "specs/petstore.json")
    assert petstore.auth == SourceBearerAuth(type="bearer", token_env="PETSTORE_TOKEN")
    assert isinstance(weather, OpenAPISourceDefinition) and weather.spec == "https://weather.example.com/openapi.json"
    assert isinstance(weather.auth, SourceQueryAuth) and weather.auth.name == "appid"


def test_explicit_max_concurrent_runs_is_kept(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[sandbox]\nmax_workers = 4\n[server]\nmax_concurrent_runs = 1\n"), env={})
    assert config.server.max_concurrent_runs == 1


def test_to_dict_is_json_and_redacts_secrets(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), env={"TETHER_SECRET": "signing-secret-value"})
    recorded = config.to_dict()
    text = json.dumps(recorded)
    for secret in ("hunter2", "file-token", "s3cret", "Bearer abc", "signing-secret-value"):
        assert secret not in text
    assert recorded["store"]["url"] == "postgresql://tether:<redacted>@db.internal/tether"
    assert recorded["server"]["token"] == "<redacted>"
    assert recorded["sources"][2]["env"] == {"TZ": "<redacted>", "API_KEY": "<redacted>"}
    assert recorded["limits"]["host_calls"] == 7
    assert recorded["home"] == str(config.home)


# --- environment --------------------------------------------------------------


def test_env_overrides(tmp_path: Path) -> None:
    env = {
        "TETHER_HOME": str(tmp_path / "elsewhere"),
        "TETHER_STORE_URL": "postgresql://localhost/tether",
        "TETHER_SECRET": "0123456789abcdef",
        "TETHER_TOKEN": "env-token",
    }
    config = load_config(write(tmp_path, FULL), env=env)
    assert config.home == tmp_path.resolve() / "elsewhere"
    assert config.store.url == "postgresql://localhost/tether"  # beats the file
    assert config.secret == "0123456789abcdef"
    assert config.server.token == "env-token"  # beats the file


def test_tether_home_moves_the_default_store(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env={"TETHER_HOME": str(tmp_path / "h")})
    assert config.store.url == f"sqlite:///{tmp_path.resolve()}/h/tether.db"


def test_a_file_store_url_is_not_replaced_by_the_home_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[store]\nurl = "sqlite:///x.db"\n'), env={"TETHER_HOME": "/tmp/h"})
    assert config.store.url == "sqlite:///x.db"


def test_empty_env_values_count_as_unset(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), env={"TETHER_TOKEN": "", "TETHER_STORE_URL": "", "TETHER_SECRET": ""})
    assert config.server.token == "file-token"
    assert config.store.url.startswith("postgresql://")
    assert config.secret is None


def test_bad_env_store_url_names_the_variable_and_hides_the_password(tmp_path: Path) -> None:
    lines = problems(tmp_path, "", env={"TETHER_STORE_URL": "mysql://u:pw@h/db"})
    assert lines == [
        "TETHER_STORE_URL: must be a sqlite:///path or postgresql:// URL (got 'mysql://u:<redacted>@h/db')"
    ]


def test_os_environ_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_TOKEN", "from-os")
    assert load_config(write(tmp_path, ""), env=None).server.token == "from-os"


# --- one clear error per bad key ---------------------------------------------


def test_negative_limit(tmp_path: Path) -> None:
    lines = problems(tmp_path, "[limits]\nhost_calls = -1\n")
    assert lines == ["{}: limits.host_calls: must be a positive integer (got -1)".format(tmp_path / "tether.toml")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[limits]\nhost_calls = 0", "limits.host_calls: must be a positive integer (got 0)"),
        ('[limits]\nhost_calls = "5"', "limits.host_calls: must be a positive integer (got '5')"),
        ("[limits]\nhost_calls = true", "limits.host_calls: must be a positive integer (got true)"),
        ("[limits]\nhost_calls = 2.5", "limits.host_calls: must be a positive integer (got 2.5)"),
        ("[limits]\nrun_seconds = -0.5", "limits.run_seconds: must be a positive number of seconds (got -0.5)"),
        ("limits = 5", "limits: must be a table (got 5)"),
        ('[policy]\nwrites = "maybe"', "policy.writes: must be one of 'ask', 'allow', 'guard', 'deny' (got 'maybe')"),
        (
            '[policy]\nrules = [{match = "helpdesk.*", action = "yes"}]',
            "policy.rules[0].action: must be one of 'allow', 'ask', 'deny' (got 'yes')",
        ),
        (
            '[policy]\nrules = [{match = "helpdesk", action = "ask"}]',
            "policy.rules[0].match: must be a 'namespace.tool' glob such as 'helpdesk.*', or '*' (got 'helpdesk')",
        ),
        (
            '[policy]\nrules = [{action = "ask"}]',
            "policy.rules[0].match: required key missing "
            "(it must be a 'namespace.tool' glob such as 'helpdesk.*', or '*')",
        ),
        (
            '[policy]\nrules = "helpdesk.*"',
            'policy.rules: must be a list of tables like {match = "helpdesk.*", action = "ask"} (got \'helpdesk.*\')',
        ),
        (
            '[store]\nurl = "mysql://h/db"',
            "store.url: must be a sqlite:///path or postgresql:// URL (got 'mysql://h/db')",
        ),
        ('[sandbox]\ntype_check = "yes"', "sandbox.type_check: must be true or false (got 'yes')"),
        ('[sandbox]\ncheck = "strict"', "sandbox.check: must be one of 'calls', 'full', 'off' (got 'strict')"),
        ("[sandbox]\nmin_workers = 3", "sandbox.min_workers: must not exceed max_workers (2) (got 3)"),
        (
            "[server]\nport = 70000",
            "server.port: must be a port number from 0 to 65535 (0 picks a free port) (got 70000)",
        ),
        ("[server]\nqueue_depth = -1", "server.queue_depth: must be a non-negative integer (got -1)"),
        ('sources = "x"', "sources: must be an array of tables, written [[sources]] (got 'x')"),
    ],
)
def test_each_kind_of_bad_key(tmp_path: Path, text: str, expected: str) -> None:
    assert one_problem(tmp_path, text + "\n") == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('type = "grpc"', "sources[0].type: must be one of 'python', 'mcp', 'openapi' (got 'grpc')"),
        ('module = "m"', "sources[0]: missing key 'type' (expected one of 'python', 'mcp', 'openapi')"),
        ('type = "python"', "sources[0].module: required key missing (it must be a non-empty string)"),
        (
            'type = "python"\nmodule = "m"\nnamespace = "my-tools"',
            "sources[0].namespace: must be a Python identifier "
            "(ASCII letters, digits and underscores, not starting with a digit) (got 'my-tools')",
        ),
        (
            'type = "mcp"\nnamespace = "class"\nurl = "https://x"',
            "sources[0].namespace: must be a Python identifier "
            "(ASCII letters, digits and underscores, not starting with a digit) (got 'class')",
        ),
        (
            'type = "mcp"\nnamespace = "t"',
            "sources[0]: set exactly one of 'command' (a stdio server) or 'url' (an HTTP server)",
        ),
        (
            'type = "mcp"\nnamespace = "t"\ncommand = ["a"]\nurl = "https://x"',
            "sources[0]: set exactly one of 'command' (a stdio server) or 'url' (an HTTP server)",
        ),
        (
            'type = "mcp"\nnamespace = "t"\nurl = "https://x"\nenv = {A = "b"}',
            "sources[0]: 'env' and 'cwd' apply only to a 'command' server",
        ),
        (
            'type = "mcp"\nnamespace = "t"\ncommand = []',
            "sources[0].command: must be a non-empty list of strings (got a list)",
        ),
        (
            'type = "mcp"\nnamespace = "t"\ncommand = ["a", 5]',
            "sources[0].command[1]: must be a non-empty list of strings (got 5)",
        ),
        (
            'type = "mcp"\nnamespace = "t"\nurl = "ftp://x"',
            "sources[0].url: must be an http:// or https:// URL (got 'ftp://x')",
        ),
        (
            'type = "mcp"\nnamespace = "t"\ncommand = ["a"]\nenv = {KEY = 123456}',
            "sources[0].env.KEY: must be a table of strings (got a value of type int)",
        ),
        (
            'type = "openapi"\nnamespace = "p"\nspec = "s.json"\nauth = {type = "basic"}',
            "sources[0].auth.type: must be one of 'bearer', 'header', 'query' (got 'basic')",
        ),
        (
            'type = "openapi"\nnamespace = "p"\nspec = "s.json"\nauth = {token_env = "T"}',
            "sources[0].auth: missing key 'type' (expected one of 'bearer', 'header', 'query')",
        ),
        (
            'type = "openapi"\nnamespace = "p"\nspec = "s.json"\n'
            'auth = {type = "header", name = "X-Key", value_env = "1X"}',
            "sources[0].auth.value_env: must be the name of an environment variable (got '1X')",
        ),
    ],
)
def test_each_kind_of_bad_source(tmp_path: Path, source: str, expected: str) -> None:
    assert one_problem(tmp_path, f"[[sources]]\n{source}\n") == expected


def test_duplicate_namespaces(tmp_path: Path) -> None:
    text = (
        '[[sources]]\ntype = "python"\nmodule = "a"\nnamespace = "crm"\n'
        '[[sources]]\ntype = "mcp"\nnamespace = "crm"\nurl = "https://x"\n'
    )
    assert one_problem(tmp_path, text) == (
        "sources[1].namespace: namespace 'crm' is already used by sources[0]; namespaces must be unique"
    )


def test_a_bad_token_is_not_echoed(tmp_path: Path) -> None:
    assert one_problem(tmp_path, "[server]\ntoken = 123456789\n") == (
        "server.token: must be a non-empty string (got a value of type int)"
    )


# --- unknown keys -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[limts]\nhost_calls = 1", "limts: unknown key 'limts' (did you mean 'limits'?)"),
        ("[limits]\nhost_call = 1", "limits.host_call: unknown key 'host_call' (did you mean 'host_calls'?)"),
        ('[[sources]]\ntype = "python"\nmodul = "m"', "sources[0].modul: unknown key 'modul' (did you mean 'module'?)"),
        (
            '[[sources]]\ntype = "openapi"\nnamespace = "p"\nspec = "s"\nauth = {type = "bearer", token = "T"}',
            "sources[0].auth.token: unknown key 'token' (did you mean 'token_env'?)",
        ),
        (
            "[sandbox]\ncolour = 1",
            "sandbox.colour: unknown key 'colour' (expected one of: min_workers, max_workers, check, type_check)",
        ),
    ],
)
def test_unknown_key_suggestion(tmp_path: Path, text: str, expected: str) -> None:
    lines = problems(tmp_path, text + "\n")
    assert any(line.split(": ", 1)[1] == expected for line in lines), lines


def test_home_is_not_a_file_key(tmp_path: Path) -> None:
    # TETHER_HOME comes from the environment only.
    assert one_problem(tmp_path, 'home = "/x"\n').startswith("home: unknown key 'home'")


# --- all problems at once -----------------------------------------------------


def test_multiple_errors_reported_together_in_file_order(tmp_path: Path) -> None:
    text = """
[limts]
x = 1

[limits]
host_calls = -1
memory_bytes = "lots"

[policy]
writes = "sometimes"

[[sources]]
type = "mcp"
namespace = "9lives"
command = ["x"]
"""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    lines = caught.value.message.splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "limts",
        "limits.memory_bytes",
        "limits.host_calls",
        "policy.writes",
        "sources[0].namespace",
    ]
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert [error["key"] for error in caught.value.details["errors"]] == [
        "limts",
        "limits.memory_bytes",
        "limits.host_calls",
        "policy.writes",
        "sources[0].namespace",
    ]
    # Never a raw pydantic dump.
    assert "validation error" not in caught.value.message
    assert "pydantic" not in caught.value.message


# --- the file itself ----------------------------------------------------------


def test_invalid_toml_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nhost_calls = 5\n[policy\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert caught.value.details["line"] == 3
    assert caught.value.details["column"] == 8
    assert caught.value.message.startswith(f"{path}: invalid TOML at line 3, column 8: ")


def test_invalid_toml_at_end_of_document(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, "[limits]\nhost_calls ="), env={})
    assert (caught.value.details["line"], caught.value.details["column"]) == (2, 13)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as caught:
        load_config(tmp_path / "nope.toml", env={})
    # No key to fix in a file that is not there: the next action is about the path.
    assert "--config" in caught.value.next_action and "key" not in caught.value.next_action


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "tether.toml"
    path.write_bytes(b"[limits]\n# \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path, env={})


def test_from_dict_names_its_source() -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_dict({"limits": {"host_calls": 0}}, source="inline", env={})
    assert caught.value.message == "inline: limits.host_calls: must be a positive integer (got 0)"


async def test_store_run_signature_reaches_the_runtime_and_a_bad_one_is_named(tmp_path: Path) -> None:
    """[store] run_signature = 1 (a rolling upgrade, docs/deploy.md) makes the runtime sign runs in format 1."""
    from tether import open_runtime

    text = f'[store]\nurl = "sqlite:///{tmp_path}/t.db"\nrun_signature = 1\n'
    assert load_config(write(tmp_path, f'[store]\nurl = "sqlite:///{tmp_path}/t.db"\n'), env={}).store.run_signature == 2
    async with open_runtime(load_config(write(tmp_path, text), env={})) as rt:
        r = await rt.execute("1 + 1")
        assert r.status == "completed"
        mac = rt.store.get_run(r.run_id).mac
        assert "format" not in mac and "names" not in mac
    assert one_problem(tmp_path, "[store]\nrun_signature = 3\n") == "store.run_signature: must be one of 1, 2 (got 3)"

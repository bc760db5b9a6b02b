"""The public API is small and deliberate: exports are sorted and import cleanly."""

import tether


def test_exports_are_sorted_and_resolve():
    assert tether.__all__ == sorted(tether.__all__)
    for name in tether.__all__:
        assert getattr(tether, name) is not None


def test_every_error_has_a_stable_code_and_next_action():
    import inspect

    from tether import errors

    codes = {}
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.TetherError):
            assert cls.code and cls.next_action, name
            codes.setdefault(cls.code, name)
    assert len(codes) >= 15


async def test_readme_python_api_example_works():
    from tether import Runtime, tool

    @tool(read_only=True, namespace="helpdesk")
    def get_ticket(ticket_id: str) -> dict:
        """Get one ticket."""
        return {"id": ticket_id, "status": "open"}

    async with Runtime(tools=[get_ticket]) as rt:
        result = await rt.execute("import tools\n(await tools.helpdesk.get_ticket(ticket_id='T1'))['status']")
        assert result.status == "completed" and result.result == "open"
        assert rt.search("ticket")["results"][0]["address"] == "helpdesk.get_ticket"


def test_the_readme_config_example_is_valid(tmp_path):
    import re
    from pathlib import Path

    from tether._config import load_config

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    # The OAuth steps' snippet, the configuration section's example, then the idempotency one.
    oauth, block, keyed = re.findall(r"```toml\n(.*?)```", readme, re.S)
    path = tmp_path / "tether.toml"
    path.write_text(block)
    config = load_config(path)
    assert [s.type for s in config.sources] == ["python", "mcp", "openapi"]
    assert config.policy.rules[0].match == "helpdesk.add_*"
    assert config.auth is not None and config.auth.rights["approve"].values == ["tether-approvers"]
    path.write_text("\n".join(line.strip() for line in oauth.splitlines()))
    config = load_config(path)
    assert config.auth is not None and config.auth.console_client_secret_env == "TETHER_CONSOLE_SECRET"
    path.write_text(keyed)
    config = load_config(path)
    assert [(s.type, s.idempotency) for s in config.sources] == [("openapi", "key"), ("mcp", "key")]


def test_the_runtime_is_a_small_documented_face():
    """Runtime keeps at most 20 public methods, each with a docstring (issue 21): plumbing lives on the
    engine's services (tether._engine), which never receive the Runtime."""
    from tether import Runtime

    methods = [n for n in dir(Runtime) if not n.startswith("_") and callable(getattr(Runtime, n))]
    assert len(methods) <= 20, methods
    assert [n for n in methods if not (getattr(Runtime, n).__doc__ or "").strip()] == []
    # Its services are reached through one attribute, not set on it from outside.
    assert {"engine", "store", "catalog"} <= {n for n in dir(Runtime) if not n.startswith("_")}

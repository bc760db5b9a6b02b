"""The public API is small and deliberate: exports are sorted and import cleanly."""

import importlib
import types

import tether

# The public modules: everything else under tether is private (a leading underscore), or the CLI and demo.
PUBLIC_MODULES = ("errors", "store", "sources")


def test_exports_are_sorted_and_resolve():
    assert tether.__all__ == sorted(tether.__all__)
    for name in tether.__all__:
        assert getattr(tether, name) is not None


def test_all_is_exactly_the_public_surface_and_every_name_is_tethers():
    """httpx-style: tether.__all__ lists every public name of the package (modules aside), and each
    says it is tether's (``__module__``), so a user never learns a private path from a repr or traceback."""
    for module in PUBLIC_MODULES:
        importlib.import_module(f"tether.{module}")
    public = sorted(name for name, value in vars(tether).items()
                    if not name.startswith("_") and not isinstance(value, types.ModuleType))
    assert public == tether.__all__
    assert [n for n in tether.__all__ if getattr(tether, n).__module__ != "tether"] == []
    assert repr(tether.Runtime) == "<class 'tether.Runtime'>"


def test_the_public_modules_export_what_they_name():
    from tether import errors, sources, store

    for module in (errors, sources, store):
        exported = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for name in exported:
            assert getattr(module, name) is not None, (module.__name__, name)
    # A backend implements the Store protocol and is opened by URL; a source kind implements Source.
    assert {"Store", "open_store", "RunRecord", "Conflict"} <= set(store.__all__)
    assert "Source" in sources.__all__
    opened = store.open_store("sqlite:///:memory:")
    try:
        assert opened.get_run("run_none") is None
    finally:
        opened.close()
    assert issubclass(errors.RunNotFound, tether.TetherError) and errors.RunNotFound is tether.RunNotFound


async def test_open_runtime_is_exported_and_loads_a_config(tmp_path):
    """README: ``from tether import open_runtime`` loads tether.toml as the CLI does."""
    path = tmp_path / "tether.toml"
    path.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/tether.db"\n\n[policy]\nwrites = "allow"\n')
    async with tether.open_runtime(config_path=path) as rt:
        result = await rt.execute("1 + 2")
        assert result.status == "completed" and result.result == 3
        assert rt.policy.writes == "allow"


def test_every_error_has_a_stable_code_and_next_action():
    import inspect

    from tether import errors

    codes = {}
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.TetherError):
            assert cls.code and cls.next_action, name
            codes.setdefault(cls.code, name)
    assert len(codes) >= 15


def test_the_runtime_is_a_small_documented_face():
    """Runtime keeps at most 20 public methods, each with a docstring: plumbing lives on the
    engine's services (tether._engine), which never receive the Runtime."""
    from tether import Runtime

    methods = [n for n in dir(Runtime) if not n.startswith("_") and callable(getattr(Runtime, n))]
    assert len(methods) <= 20, methods
    assert [n for n in methods if not (getattr(Runtime, n).__doc__ or "").strip()] == []
    # Its services are reached through one attribute, not set on it from outside.
    assert {"engine", "store", "catalog"} <= {n for n in dir(Runtime) if not n.startswith("_")}


def test_the_framework_adapters_export_what_they_name():
    """docs/integrations.md: each adapter is a public module of its own (an extra), with a sorted __all__."""
    for name in ("pydantic_ai", "langgraph", "openai_agents"):
        module = importlib.import_module(f"tether.integrations.{name}")
        assert module.__all__ == sorted(module.__all__) and module.__all__
        for exported in module.__all__:
            assert getattr(module, exported) is not None, (name, exported)

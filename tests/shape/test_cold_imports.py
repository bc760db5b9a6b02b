"""A cold `tether run` imports what the run uses, not every optional feature.

Each module named here was once on the path of `tether run` of a program that uses none of it, and cost a
cold start milliseconds of CPU (measured apart: jsonschema ~45 ms, prometheus_client ~25, OpenTelemetry's
API ~4); bench/sources_bench.py measures the start itself (its no-source row). A failure names the module
and the chain is printed by `python -X importtime`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Imported only when used: a tool's arguments checked (jsonschema), a tracer provider set (OpenTelemetry),
# metrics scraped (prometheus_client, and the http.server its exporter imports), [[notify]] webhooks set
# (the server's notifier), a server started at all (tether._server).
NOT_ON_A_PLAIN_RUN = ("jsonschema", "opentelemetry", "prometheus_client", "http.server", "tether._server")

_PROBE = """
import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules))))
from tether.cli import main
sys.exit(main(["run", "one.py"]))
"""


def _modules_of_a_run(tmp_path: Path) -> list[str]:
    (tmp_path / "one.py").write_text("1 + 1\n")
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(out)], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(env, TETHER_HOME=str(tmp_path / "home")), timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stdout + proc.stderr
    modules: list[str] = json.loads(out.read_text())
    return modules


def test_a_run_that_uses_no_optional_feature_does_not_import_it(tmp_path: Path) -> None:
    modules = _modules_of_a_run(tmp_path)
    assert "tether._engine.attempt.driver" in modules  # the probe did run a program
    loaded = [m for m in modules if any(m == name or m.startswith(name + ".") for name in NOT_ON_A_PLAIN_RUN)]
    assert loaded == []


def test_import_tether_leaves_the_app_config_and_source_kinds_for_open_runtime() -> None:
    """A program that builds a Runtime of its own tools never loads a tether.toml: it does not pay for the
    config's models or the [[sources]] kinds' (pydantic models built at import)."""
    probe = ("import sys, tether; "
             "print(sorted(m for m in ('tether._app', 'tether._config', 'tether._sources.kinds') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# The framework adapters (tether.integrations) and the frameworks themselves: each an optional extra,
# imported only by a host that uses it (docs/integrations.md).
FRAMEWORKS = ("tether.integrations", "pydantic_ai", "langgraph", "langchain_core", "agents", "openai")


def test_import_tether_and_a_plain_run_import_no_agent_framework(tmp_path: Path) -> None:
    probe = ("import sys, tether; "
             f"print(sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FRAMEWORKS!r})))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    modules = _modules_of_a_run(tmp_path)
    assert [m for m in modules if any(m == f or m.startswith(f + ".") for f in FRAMEWORKS)] == []
    # The check can see one: the frameworks are installed here (the test extra), and an adapter loads its own.
    proc = subprocess.run([sys.executable, "-c", "import sys, tether.integrations.pydantic_ai; "
                           "print('pydantic_ai' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stderr

"""Every benchmark runs in CI's quick pass (bench/README.md: "How the benches run").

`.ci/run` runs `make bench BENCH_ARGS=--quick`, i.e. bench/run_all.py, which runs the benchmarks it lists;
a benchmark it does not list is run by nobody and rots unseen.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def test_every_bench_script_is_run_by_run_all():
    spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
    assert spec is not None and spec.loader is not None
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    scripts = {p.name for p in BENCH.glob("*_bench.py")}
    listed = set(run_all.BENCHES.values())
    assert listed <= scripts, f"run_all.py lists benchmarks that do not exist: {sorted(listed - scripts)}"
    assert scripts == listed, f"benchmarks run_all.py does not run: {sorted(scripts - listed)}"

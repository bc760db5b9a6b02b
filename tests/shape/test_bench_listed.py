"""Every benchmark runs in CI's quick pass or says why not (issue 24: benches that never rot).

`.ci/run` runs `make bench BENCH_ARGS=--quick`, i.e. bench/run_all.py, which runs the benchmarks it lists;
a benchmark it does not list is run by nobody and rots unseen, as three did before.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def test_every_bench_script_is_run_by_run_all_or_named_as_not_run():
    spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
    assert spec is not None and spec.loader is not None
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    scripts = {p.name for p in BENCH.glob("*_bench.py")}
    listed = set(run_all.BENCHES.values())
    assert listed <= scripts, f"run_all.py lists benchmarks that do not exist: {sorted(listed - scripts)}"
    # NOT_RUN may also name a measuring tool that is not a *_bench.py (timeline_execute.py): it must exist.
    missing = {name for name in run_all.NOT_RUN if not (BENCH / name).is_file()}
    assert not missing, f"run_all.py's NOT_RUN names scripts that do not exist: {sorted(missing)}"
    not_run = {name for name in run_all.NOT_RUN if name in scripts}
    assert scripts - listed == not_run, (
        f"benchmarks neither run by run_all.py nor in its NOT_RUN: {sorted(scripts - listed - not_run)}")

"""Run every benchmark, each in its own process, and print the targets together.

    python bench/run_all.py [--quick] [--only core,search,durable]

Each benchmark prints its own tables; this script passes ``--quick`` on,
reads each one's final JSON line, prints every target as met or missed and
ends with one JSON line of its own. It exits non-zero only when a benchmark
crashed: a missed target is a finding, not a failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# By the question each answers (bench/README.md has the table): what a program costs, what discovery
# finds, what durability costs, what serving holds, what the store is asked, what a start costs, what
# months of runs leave behind, who is asked about which write.
BENCHES = {"core": "core_bench.py", "check": "check_bench.py", "bfcl": "bfcl_bench.py",
           "search": "search_bench.py", "discovery": "discovery_bench.py",
           "durable": "durable_bench.py", "long": "long_bench.py",
           "serve": "serve_bench.py",
           "roundtrip": "roundtrip_bench.py", "store_latency": "store_latency_bench.py", "replica": "replica_bench.py",
           "sources": "sources_bench.py", "openapi_cold": "openapi_cold_bench.py",
           "retention": "retention_bench.py", "agentdojo": "agentdojo_bench.py", "stream": "stream_bench.py"}
QUICK_TIMEOUT_S = 600


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset of " + ", ".join(BENCHES))
    args = p.parse_args()
    wanted = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = [b for b in wanted if b not in BENCHES]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}")

    sys.path.insert(0, str(HERE))
    import common  # noqa: E402 - after the path is set

    results, targets, crashed = {}, [], []
    for name in wanted:
        cmd = [sys.executable, str(HERE / BENCHES[name])] + (["--quick"] if args.quick else [])
        print(f"=== {name}: {' '.join(cmd[1:])}", flush=True)
        t = time.perf_counter()
        try:
            # A quick pass is CI's (.ci/run): a benchmark that hangs fails it instead of holding it.
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                                  timeout=QUICK_TIMEOUT_S if args.quick else None)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            print(out)
            print(f"--- {name}: still running after {QUICK_TIMEOUT_S} s, stopped\n", flush=True)
            crashed.append(name)
            continue
        took = time.perf_counter() - t
        lines = proc.stdout.rstrip("\n").splitlines()
        # Everything but the benchmark's JSON line, which is summarised below.
        body = lines[:-1] if lines and lines[-1].startswith("{") else lines
        print("\n".join(body))
        print(f"--- {name}: {took:.1f} s, exit {proc.returncode}\n", flush=True)
        if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
            crashed.append(name)
            continue
        data = json.loads(lines[-1])
        results[name] = data
        targets += [{**t, "target": f"{name}: {t['target']}"} for t in data.get("targets", [])]

    print(common.table(targets, common.TARGET_COLUMNS, title="=== targets (printed, never asserted)"))
    if crashed:
        print(f"crashed: {', '.join(crashed)}")
    met = sum(1 for t in targets if t["met"])
    print(json.dumps({"bench": "all", "quick": args.quick, "met": met, "missed": len(targets) - met,
                      "crashed": crashed, "targets": targets}))
    return 1 if crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())

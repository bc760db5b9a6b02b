"""`tether run` start-up with sources configured, against the same with none.

    python bench/sources_bench.py [--quick] [--rounds N] [--warmup N]

Contenders, each a fresh `tether run one.py` process (the program is `1 + 1`:
it calls no MCP tool), round-robin in one run, one TETHER_HOME each:

- no sources (baseline);
- four MCP sources (mcp-server-time, mcp-server-git, and two servers from
  tests/fixtures), tool listings cached in the store: the common case;
- the same four with an empty cache: every server is started to list its
  tools (what the first command after a config change pays);
- four sources where the second pair is replaced by a hung server
  (`sleep`) with start_timeout = 1: a broken source costs its timeout, once
  per command, plus the SDK's teardown of a server that ignores stdin.

Target: four cached sources <= 1.3x no sources (paired ratio).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
BIN = Path(sys.executable).parent


def _mcp(namespace: str, command: list[str], extra: str = "") -> str:
    return (f'[[sources]]\ntype = "mcp"\nnamespace = "{namespace}"\ncommand = {json.dumps(command)}\n{extra}\n')


def _configs(repo: Path) -> dict[str, str]:
    time_server = [str(BIN / "mcp-server-time")]
    git_server = [str(BIN / "mcp-server-git"), "--repository", str(repo)]
    fixture = [sys.executable, str(FIXTURES / "mcp_fixture_server.py")]
    paged = [sys.executable, str(FIXTURES / "mcp_paged_server.py")]
    four = (_mcp("clock", time_server) + _mcp("git", git_server) + _mcp("fx", fixture) + _mcp("paged", paged))
    hung = (_mcp("clock", time_server) + _mcp("git", git_server)
            + _mcp("hung", ["sleep", "1000"], "start_timeout = 1") + _mcp("paged", paged))
    return {"none": "", "four cached": four, "four, empty cache": four, "one hung (start_timeout 1 s)": hung}


def main() -> None:
    args = common.parser(__doc__.splitlines()[0], rounds=15, quick_rounds=3).parse_args()
    rounds, warmup = common.rounds_of(args)
    # Each round starts tether processes and MCP servers: one warm-up round is enough for the smoke pass.
    warmup = min(warmup, 1 if args.quick and args.warmup is None else 2)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        repo = base / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        samples = common.cold_start_samples(base, _configs(repo), cleared="four, empty cache", rounds=rounds,
                                            warmup=warmup)
    rows = common.ratio_rows(samples, "none")
    print(common.table(rows, common.RATIO_COLUMNS, title="=== tether run of `1 + 1`, wall time per process"))
    cached = next(r for r in rows if r["contender"] == "four cached")
    targets = [common.target("four cached MCP sources vs none (x paired)", cached["paired_ratio"], 1.3, "x")]
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("sources", args.quick, {"rows": rows, "targets": targets})


if __name__ == "__main__":
    main()

"""What every benchmark shares: the bench tools and program, interleaved timing, tables, the JSON line.

Machines here are shared and noisy, so a number on its own means little. Each
benchmark measures its contenders *in the same run*, round-robin (one sample
of each per round, the order rotated every round), after warm-up rounds, and
reports medians and ratios against a baseline measured alongside. Nothing here
asserts on time: targets are printed as met or missed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator, Sequence

# Run from a checkout without installing: `python bench/core_bench.py`.
_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from tether._sources.python import tool  # noqa: E402
from tether._tools.model import Tool  # noqa: E402

# --- the bench tools -----------------------------------------------------------
# One plain async function per tool, used by every contender: tether wraps it
# through @tool, bare Monty and FastMCP call it as it is, CPython awaits it.


@tool(namespace="bench", read_only=True)
async def get(id: int) -> dict[str, int]:
    """Get one record by id."""
    return {"id": id, "value": id * 2}


@tool(namespace="bench", destructive=True)
async def put(id: int, value: str) -> dict[str, Any]:
    """Store a value under an id (a write: the default policy asks before it is sent)."""
    return {"id": id, "value": value, "stored": True}


def bench_tools() -> list[Tool]:
    """The bench tools as tether Tools."""
    return [get.__tether_tool__.to_tool(), put.__tether_tool__.to_tool()]


CALLS = 10
# The program every core contender runs: CALLS sequentially awaited calls, then a reduce.
PROGRAM = f"""\
import tools
total = 0
for i in range({CALLS}):
    r = await tools.bench.get(id=i)
    total += r["value"]
total
"""
EXPECTED = sum(i * 2 for i in range(CALLS))
# The same program in FastMCP Code Mode's dialect: call_tool(name, params) and `return`.
FASTMCP_PROGRAM = f"""\
total = 0
for i in range({CALLS}):
    r = await call_tool("get", {{"id": i}})
    total += r["value"]
return total
"""


async def cpython_direct() -> int:
    """The program as plain CPython: the functions awaited directly."""
    total = 0
    for i in range(CALLS):
        r = await get(id=i)
        total += r["value"]
    return total


# --- timing --------------------------------------------------------------------


async def interleave(
    contenders: dict[str, Callable[[], Awaitable[Any]]],
    rounds: int,
    warmup: int,
    after_each: Callable[[str, Any], None] | None = None,
) -> dict[str, list[float]]:
    """Time each contender once per round, round-robin; return seconds per contender.

    The order rotates every round so no contender always runs first (or right
    after the noisiest neighbour). Warm-up rounds run the same way and are
    dropped. ``after_each(name, value)`` sees every measured call's return value.
    """
    names = list(contenders)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        gc.collect()
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t = time.perf_counter()
            value = await contenders[name]()
            dt = time.perf_counter() - t
            if r >= warmup:
                samples[name].append(dt)
                if after_each is not None:
                    after_each(name, value)
    return samples


@dataclass(frozen=True)
class Stats:
    n: int
    p50: float
    p10: float
    p90: float
    mean: float

    def ms(self) -> dict[str, float]:
        return {"n": self.n, "p50_ms": _r(self.p50 * 1e3), "p10_ms": _r(self.p10 * 1e3),
                "p90_ms": _r(self.p90 * 1e3), "mean_ms": _r(self.mean * 1e3)}


def stats(samples: Sequence[float]) -> Stats:
    xs = sorted(samples)
    if not xs:
        return Stats(0, float("nan"), float("nan"), float("nan"), float("nan"))
    return Stats(len(xs), statistics.median(xs), quantile(xs, 0.10), quantile(xs, 0.90), statistics.fmean(xs))


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def paired_ratio(samples: Sequence[float], baseline: Sequence[float]) -> float:
    """Median over rounds of (sample / baseline of the same round): robust to drift on a shared box."""
    return statistics.median(a / b for a, b in zip(samples, baseline) if b > 0)


def ratio_rows(samples: dict[str, list[float]], baseline: str, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per contender: p50/p10/p90 ms, ratio of p50s and paired ratio against ``baseline``."""
    base = stats(samples[baseline]).p50
    rows = []
    for name, xs in samples.items():
        s = stats(xs)
        rows.append({
            "contender": name,
            "label": (labels or {}).get(name, name),
            **s.ms(),
            "ratio": _r(s.p50 / base, 3),
            "paired_ratio": _r(paired_ratio(xs, samples[baseline]), 3),
        })
    return rows


def _r(x: float, digits: int = 3) -> float:
    return round(x, digits) if x == x else x  # keep NaN as NaN


# --- output --------------------------------------------------------------------


def table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str]], title: str | None = None) -> str:
    """A fixed-width text table; ``columns`` are (key, header) pairs."""
    rows = list(rows)
    cells = [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, ((_, h), w) in enumerate(zip(columns, widths))))
    lines.append("  ".join("-" * w for w in widths))
    for c in cells:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths))))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value != value:
            return "nan"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


RATIO_COLUMNS = [("label", "contender"), ("p50_ms", "p50 ms"), ("p10_ms", "p10 ms"), ("p90_ms", "p90 ms"),
                 ("ratio", "x base"), ("paired_ratio", "x paired")]


def target(name: str, value: float, limit: float, unit: str) -> dict[str, Any]:
    """A target line: met when ``value <= limit``. Printed, never asserted."""
    return {"target": name, "value": _r(value, 3), "limit": limit, "unit": unit, "met": bool(value <= limit)}


TARGET_COLUMNS = [("target", "target"), ("value", "measured"), ("limit", "limit"), ("unit", "unit"), ("met", "met")]


def emit(bench: str, quick: bool, payload: dict[str, Any]) -> None:
    """Print the final JSON line (always the last line of a benchmark's output)."""
    line = {"bench": bench, "quick": quick, "python": platform.python_version(), "cpus": os.cpu_count(), **payload}
    print(json.dumps(line, sort_keys=False, default=str), flush=True)


def parser(description: str, rounds: int, quick_rounds: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a fast smoke run: few rounds, small sizes")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"measured rounds per contender (default {rounds}, {quick_rounds} with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured warm-up rounds (default 10, 3 with --quick)")
    p.set_defaults(_rounds=(rounds, quick_rounds))
    return p


def add_stream_flag(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--stream-async-calls", choices=("on", "off"), default=None,
                   help="pydantic-monty's streamed async calls for bare Monty's pool and tether's alike "
                        "(default: tether's setting, D-80)")
    return p


def stream_setting(args: argparse.Namespace) -> bool:
    """The ``--stream-async-calls`` setting, made tether's too: every SandboxPool made after this takes it, so
    bare Monty and tether run under the same one (D-80)."""
    from tether._sandbox import monty

    on = monty.STREAM_ASYNC_CALLS if args.stream_async_calls is None else args.stream_async_calls == "on"
    monty.STREAM_ASYNC_CALLS = on
    return bool(on)


def rounds_of(args: argparse.Namespace) -> tuple[int, int]:
    full, quick = args._rounds
    rounds = args.rounds if args.rounds is not None else (quick if args.quick else full)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    return rounds, warmup


# --- processes -----------------------------------------------------------------


def child_processes(name: str = "monty") -> list[dict[str, Any]]:
    """Descendants of this process whose command name contains ``name`` (Linux /proc; no psutil needed).

    Each is ``{"pid", "state"}``; state "Z" is a zombie (exited, not yet reaped).
    """
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        pid, state, ppid = int(entry), fields[0], int(fields[1])
        children.setdefault(ppid, []).append(pid)
        info[pid] = (comm, state)
    out, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        comm, state = info.get(pid, ("", ""))
        if name in comm:
            out.append({"pid": pid, "state": state})
        todo.extend(children.get(pid, []))
    return out


def live(procs: list[dict[str, Any]]) -> int:
    return sum(1 for p in procs if p["state"] != "Z")


# -- cold starts: `tether run` of `1 + 1` as a fresh process, one folder per configuration ----------------


def tether_run_once(cwd: Path, home: Path, clear: bool) -> float:
    """Seconds for one `tether run one.py` in ``cwd`` with its store under ``home`` (emptied first if ``clear``)."""
    import shutil
    import subprocess

    if clear:
        shutil.rmtree(home, ignore_errors=True)
    env = dict(os.environ, TETHER_HOME=str(home))
    env.pop("TETHER_STORE_URL", None)
    # An installed tether starts from bytecode. With PYTHONDONTWRITEBYTECODE (set on the machines here) a
    # source checkout compiled every module on every start: ~100 ms more on each side of every ratio.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "tether"), "run", "one.py"], cwd=cwd, env=env,
                          capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0 or proc.stdout.strip() != "2":
        raise SystemExit(f"tether run failed in {cwd}: {proc.stdout}{proc.stderr}")
    return took


def cold_start_samples(base: Path, configs: dict[str, str], *, cleared: str, rounds: int,
                       warmup: int) -> dict[str, list[float]]:
    """Per configuration (name -> tether.toml text), the seconds of each measured `tether run` of `1 + 1`.

    Each round runs every configuration once, in an order rotated by one each
    round so that drift on a shared machine falls on all alike; ``cleared``
    names the one whose store is emptied before every run.
    """
    dirs = {}
    for i, (name, text) in enumerate(configs.items()):
        d = base / f"c{i}"
        d.mkdir()
        (d / "tether.toml").write_text(text)
        (d / "one.py").write_text("1 + 1\n")
        dirs[name] = d
    samples: dict[str, list[float]] = {name: [] for name in dirs}
    for r in range(warmup + rounds):
        names = list(dirs)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            took = tether_run_once(dirs[name], dirs[name] / "home", clear=name == cleared)
            if r >= warmup:
                samples[name].append(took)
    return samples


def tree_of(spec: str, scratch: Path) -> Path:
    """A folder holding src/tether for ``spec``: a folder as it is, or a commit's src by git archive."""
    import subprocess

    if (Path(spec) / "src" / "tether").is_dir():
        return Path(spec).resolve()
    out = scratch / spec.replace("/", "_")
    out.mkdir()
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", spec, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


@contextlib.contextmanager
def postgres_cluster() -> Iterator[Any | None]:
    """A throwaway Postgres cluster (tests/pg.py) for a bench's Postgres half, or None with why printed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import pg

    reason = pg.missing_reason()
    if reason:
        print(f"postgres skipped: {reason}")
        yield None
        return
    cluster = pg.start()
    try:
        yield cluster
    finally:
        cluster.stop()

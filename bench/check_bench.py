"""The pre-run check: what default settings cost against bare Monty, at any catalog size.

One run, every table interleaved round by round (see common.py):

A. The core program (10 sequential calls) — bare Monty ``feed_run`` (the
   floor), tether with default settings (``check = "calls"``), check off, the
   full check on a program seen for the first time (cold: each round's
   program differs by a comment) and again (warm: the verdict is
   remembered), and FastMCP Code Mode's default.
B. Short turns: programs of 1–4 calls against a 130-tool catalog, rotated per
   round; bare Monty vs tether default vs check off.
C. The core program against a 10,000-tool catalog vs a 10-tool one, default
   settings.
D. GitHub's REST description (npm ``@octokit/openapi``,
   ``generated/api.github.com.json``, 1,221 operations), installed by
   ``discovery_bench.install()`` into a cache outside the repository (never by
   the test suite): the default check of a program on its own, and whole
   executes with the default and the full check at default memory.

    python bench/check_bench.py [--quick] [--rounds N] [--no-github]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

import pydantic_monty as pm

import common
from common import EXPECTED, FASTMCP_PROGRAM, PROGRAM, get
from tether._runtime import Runtime
from tether._tools.catalog import Catalog
from tether._tools.precheck import check_program

TARGETS = {"default": 1.5, "off": 1.2, "short": 3.0, "scale": 1.2, "github_check_ms": 10.0, "fastmcp": 3.0}

SHORT_PROGRAMS = [
    "import tools\n(await tools.bench.get(1))['value']",
    "import tools\na = await tools.bench.get(id=1)\nb = await tools.bench.get(2)\na['value'] + b['value']",
    "import asyncio\nimport tools\nrs = await asyncio.gather(tools.bench.get(1), tools.bench.get(2), tools.bench.get(3))\n"
    "sum(r['value'] for r in rs)",
    "from tools import bench\nt = 0\nfor i in range(4):\n    t += (await bench.get(i))['value']\nt",
]
SHORT_EXPECTED = [2, 6, 12, 12]

GITHUB_PROGRAM = """\
import tools
gh = tools.github
try:
    issue = await gh.issues_get("octocat", "hello-world", 1)
    title = issue["title"]
except Exception as e:
    title = str(e)[:12]
labels = [l for l in ["bug", "docs"] if l != "x"]
f = tools.github.issues_create
{"title": title, "labels": labels, "n": len(labels)}
"""


def bare_modules() -> dict[str, Any]:
    return {"tools": pm.ExternalModule({"bench": pm.ExternalModule({"get": get})})}


async def core(rounds: int, warmup: int) -> dict[str, Any]:
    from fastmcp import Client, FastMCP
    from fastmcp.experimental.transforms.code_mode import CodeMode

    counter = [0]
    async with (
        pm.AsyncMonty(min_processes=1, max_processes=2) as pool,
        Runtime(tools=common.bench_tools()) as rt,
    ):
        modules = bare_modules()

        async def bare(code: str = PROGRAM) -> Any:
            async with pool.checkout(external_modules=modules) as session:
                return await session.feed_run(code)

        async def tether(check: str | None, code: str = PROGRAM) -> Any:
            r = await rt.execute(code, check=check) if check else await rt.execute(code)
            if r.status != "completed":
                raise RuntimeError(f"tether run {r.status}: {r.error}")
            return r.result

        async def full_cold() -> Any:
            counter[0] += 1
            return await tether("full", PROGRAM + f"# program {counter[0]}\n")

        mcp = FastMCP("bench")
        mcp.tool(get)
        mcp.add_transform(CodeMode())
        async with Client(mcp) as client:

            async def fastmcp() -> Any:
                r = await client.call_tool("execute", {"code": FASTMCP_PROGRAM})
                return int(r.content[0].text)

            contenders = {
                "bare": bare,
                "default": lambda: tether(None),
                "off": lambda: tether("off"),
                "full_cold": full_cold,
                "full_warm": lambda: tether("full"),
                "fastmcp": fastmcp,
            }

            def check(name: str, value: Any) -> None:
                if value != EXPECTED:
                    raise RuntimeError(f"{name} computed {value!r}, not {EXPECTED}")

            samples = await common.interleave(contenders, rounds, warmup, after_each=check)
    return samples


async def short_turns(rounds: int, warmup: int) -> dict[str, list[float]]:
    from search_bench import make_catalog_tools

    catalog = Catalog(make_catalog_tools(128) + common.bench_tools())
    assert len(catalog) == 130
    turn = [0]
    async with (
        pm.AsyncMonty(min_processes=1, max_processes=2) as pool,
        Runtime(catalog=catalog) as rt,
    ):
        modules = bare_modules()

        async def bare() -> Any:
            async with pool.checkout(external_modules=modules) as session:
                return await session.feed_run(SHORT_PROGRAMS[turn[0] % 4])

        async def tether(check: str | None) -> Any:
            code = SHORT_PROGRAMS[turn[0] % 4]
            r = await rt.execute(code, check=check) if check else await rt.execute(code)
            if r.status != "completed":
                raise RuntimeError(f"tether run {r.status}: {r.error}")
            return r.result

        def advance(name: str, value: Any) -> None:
            if value != SHORT_EXPECTED[turn[0] % 4]:
                raise RuntimeError(f"{name} computed {value!r}")
            seen[0] += 1
            if seen[0] % 3 == 0:  # all three contenders ran this program: next one
                turn[0] += 1

        seen = [0]
        # Warm-up rounds are not passed to after_each; run them here so turns stay aligned.
        for _ in range(warmup):
            for fn in (bare, lambda: tether(None), lambda: tether("off")):
                await fn()
        return await common.interleave({"bare": bare, "default": lambda: tether(None), "off": lambda: tether("off")},
                                       rounds, 0, after_each=advance)


async def scale(rounds: int, warmup: int) -> dict[str, list[float]]:
    from search_bench import make_catalog_tools

    small = Catalog(make_catalog_tools(8, seed=3) + common.bench_tools())
    big = Catalog(make_catalog_tools(10_000) + common.bench_tools())
    async with Runtime(catalog=small) as rt_small, Runtime(catalog=big) as rt_big:

        async def run(rt: Runtime) -> Any:
            r = await rt.execute(PROGRAM)
            if r.status != "completed":
                raise RuntimeError(f"run {r.status}: {r.error}")
            return r

        return await common.interleave({"small": lambda: run(rt_small), "big": lambda: run(rt_big)}, rounds, warmup)


async def github(rounds: int) -> dict[str, Any]:
    import discovery_bench

    modules = discovery_bench.install()
    catalog = await discovery_bench.load("github", modules / discovery_bench.CATALOGS["github"])
    out: dict[str, Any] = {"operations": len(catalog)}
    # The check alone, on a program it has not seen (a comment defeats the verdict cache).
    samples = []
    for i in range(max(rounds, 50)):
        code = GITHUB_PROGRAM + f"# {i}\n"
        t = time.perf_counter()
        reach = check_program(code, catalog)
        samples.append(time.perf_counter() - t)
    out["check"] = common.stats(samples).ms()
    out["reach"] = sorted(reach.addresses) + [f"{ns}.*" for ns in reach.namespaces]
    async with Runtime(catalog=catalog) as rt:
        for mode in ("calls", "full"):
            times, status = [], None
            for i in range(max(5, rounds // 4)):
                code = GITHUB_PROGRAM + f"# {mode} {i}\n"  # never seen: a cold check every time
                t = time.perf_counter()
                r = await rt.execute(code, check=mode)
                times.append(time.perf_counter() - t)
                status = r.status if r.status != "failed" else f"failed: {r.error['code']}"
            out[f"execute_{mode}"] = {**common.stats(times).ms(), "status": status,
                                      "result": r.result if r.status == "completed" else r.error["message"][:200]}
    return out


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], rounds=100, quick_rounds=12)
    p.add_argument("--no-github", action="store_true", help="skip the GitHub catalog (needs npm the first time)")
    args = p.parse_args()
    rounds, warmup = common.rounds_of(args)

    a = asyncio.run(core(rounds, warmup))
    rows_a = common.ratio_rows(a, "bare", {
        "bare": "bare Monty feed_run (baseline)", "default": "tether, default settings (check = calls)",
        "off": "tether, check off (the engine)", "full_cold": "tether, check = full, program not seen before",
        "full_warm": "tether, check = full, program seen before", "fastmcp": "FastMCP Code Mode, default"})
    print(common.table(rows_a, common.RATIO_COLUMNS, title=f"A. 10 sequential calls, {rounds} interleaved rounds"))
    b = asyncio.run(short_turns(rounds, warmup))
    rows_b = common.ratio_rows(b, "bare", {"bare": "bare Monty feed_run (baseline)",
                                           "default": "tether, default settings", "off": "tether, check off"})
    print()
    print(common.table(rows_b, common.RATIO_COLUMNS, title="B. 1-4-call programs, 130-tool catalog"))
    c = asyncio.run(scale(rounds, warmup))
    rows_c = common.ratio_rows(c, "small", {"small": "execute, 10-tool catalog (default settings)",
                                            "big": "execute, 10,002-tool catalog (default settings)"})
    print()
    print(common.table(rows_c, common.RATIO_COLUMNS, title="C. catalog size"))
    by_a = {r["contender"]: r for r in rows_a}
    fastmcp_vs_default = round(statistics.median(f / d for f, d in zip(a["fastmcp"], a["default"])), 2)
    targets = [
        common.target("10 calls, default settings / bare Monty", by_a["default"]["paired_ratio"], TARGETS["default"], "x"),
        common.target("10 calls, check off / bare Monty", by_a["off"]["paired_ratio"], TARGETS["off"], "x"),
        common.target("1-4 calls, 130 tools, default / bare Monty",
                      {r["contender"]: r for r in rows_b}["default"]["paired_ratio"], TARGETS["short"], "x"),
        common.target("10,000 tools / 10 tools, default settings",
                      {r["contender"]: r for r in rows_c}["big"]["paired_ratio"], TARGETS["scale"], "x"),
        {"target": "FastMCP default / tether default (how many times faster)", "value": fastmcp_vs_default,
         "limit": f">= {TARGETS['fastmcp']}", "unit": "x", "met": fastmcp_vs_default >= TARGETS["fastmcp"]},
    ]
    gh: dict[str, Any] = {}
    import discovery_bench

    if not args.no_github and args.quick and not discovery_bench.cached():
        print(f"\nD. skipped: {discovery_bench.NOT_CACHED}")
    elif not args.no_github:
        gh = asyncio.run(github(rounds))
        print()
        print(f"D. GitHub REST catalog ({gh['operations']} operations), program reaches {gh['reach']}")
        print(common.table(
            [{"what": "default check alone (cold)", **gh["check"], "status": "-"},
             {"what": "execute, default settings", **gh["execute_calls"]},
             {"what": "execute, check = full (cold), default memory", **gh["execute_full"]}],
            [("what", "GitHub catalog"), ("p50_ms", "p50 ms"), ("p10_ms", "p10"), ("p90_ms", "p90"),
             ("status", "status")]))
        targets.append(common.target("GitHub catalog: default check p50", gh["check"]["p50_ms"],
                                     TARGETS["github_check_ms"], "ms"))
        works = gh["execute_full"]["status"] == "completed" and gh["execute_calls"]["status"] == "completed"
        targets.append({"target": "GitHub catalog: execute works at default memory (default and full check)",
                        "value": gh["execute_full"]["status"], "limit": "completed", "unit": "", "met": works})
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("check", args.quick, {"rounds": rounds, "core": rows_a, "short": rows_b, "scale": rows_c,
                                      "github": gh, "targets": targets})


if __name__ == "__main__":
    main()
    # Every pool is closed by now; leaving without interpreter teardown avoids
    # the occasional abort Monty's client shows there (shared/notes), which
    # run_all.py would count as a crash.
    sys.stdout.flush()
    os._exit(0)

"""BFCL v4 multi-turn base: one turn of 1-7 calls as one tether execute, against bare Monty, turn by turn.

The Berkeley Function Calling Leaderboard's multi-turn base category (``bfcl-eval`` on PyPI, version pinned
below): 200 conversations over eight stateful APIs (a file system, a trading bot, travel booking, a car,
messages, posts, tickets, maths), 734 turns. Each turn's ground-truth calls become one program, as a model in
code mode would write it::

    import tools
    out = []
    out.append(await tools.fs.cd(folder='document'))
    out.append(await tools.fs.mkdir(dir_name='temp'))
    out

The APIs are the package's own Python classes, loaded with each conversation's initial state; every tool is
a thin async function over the current conversation's instance, the same function for both contenders:

- **bare Monty feed_run** (baseline): one warm pool, ``checkout(external_modules=...)`` + ``feed_run``;
- **tether execute, defaults**: a warm ``Runtime`` with the eight APIs as tools (declared read-only: the
  turns run without approvals, as a read-only tool set would; a write would add its write-ahead journal
  transactions), default settings (the in-memory store, ``check = "calls"``).

Each conversation runs once per contender from a fresh copy of its initial state (loading it is not timed),
the order alternating by conversation; the ratio is per turn, paired (the same turn, moments apart).
Only ``bfcl_eval``'s API classes are imported, never its evaluation pipeline, so it is installed without its
dependencies (``make bench`` does: ``pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0``).
Without it the bench prints a skip and its JSON line.

    python bench/bfcl_bench.py [--quick] [--conversations N]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import copy
import gc
import importlib
import inspect
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import common

BFCL_VERSION = "2026.3.23"
TARGET_RATIO = 5.0
# The eight APIs of the multi-turn categories, by class, with the namespace a program reaches them under.
CLASSES = {
    "GorillaFileSystem": ("gorilla_file_system", "fs"),
    "MathAPI": ("math_api", "mathapi"),
    "MessageAPI": ("message_api", "message"),
    "TwitterAPI": ("posting_api", "twitter"),
    "TicketAPI": ("ticket_api", "ticket"),
    "TradingBot": ("trading_bot", "trading"),
    "TravelAPI": ("travel_booking", "travel"),
    "VehicleControlAPI": ("vehicle_control", "vehicle"),
}
STATELESS = {"MathAPI"}
SOURCE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"


def load() -> tuple[list[dict[str, Any]], dict[str, type]] | str:
    """The conversations (each with its turns) and the API classes; a reason string if bfcl_eval is missing."""
    try:
        import bfcl_eval
    except ImportError:
        return (f"bfcl_eval is not installed (pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath==1.3.0; "
                "`make bench` does)")
    data = Path(bfcl_eval.__file__).parent / "data"
    questions = [json.loads(line) for line in (data / "BFCL_v4_multi_turn_base.json").read_text().splitlines() if line]
    answers = {a["id"]: a for a in (json.loads(line) for line in
               (data / "possible_answer" / "BFCL_v4_multi_turn_base.json").read_text().splitlines() if line)}
    classes = {name: getattr(importlib.import_module(f"{SOURCE}.{module}"), name)
               for name, (module, _) in CLASSES.items()}
    convs = [{**q, "turns": answers[q["id"]]["ground_truth"]} for q in questions]
    return convs, classes


# --- the tools: one async function per API method, over the current conversation's instance -----------------

CURRENT: dict[str, Any] = {}


def api_functions(classes: dict[str, type]) -> dict[str, dict[str, Callable[..., Any]]]:
    """{namespace: {name: async function}} for every public method of every API class."""
    out: dict[str, dict[str, Callable[..., Any]]] = {}
    for cls_name, cls in classes.items():
        ns = CLASSES[cls_name][1]
        for name, method in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            out.setdefault(ns, {})[name] = _bound(cls_name, name, method)
    return out


def _bound(cls_name: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    async def call(**kwargs: Any) -> Any:
        return _plain(getattr(CURRENT[cls_name], name)(**kwargs))

    sig = inspect.signature(method)
    call.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
    call.__name__ = call.__qualname__ = name
    call.__doc__ = (method.__doc__ or name).strip().split("\n")[0]
    call.__annotations__ = {k: v for k, v in getattr(method, "__annotations__", {}).items() if k != "self"}
    call.__module__ = method.__module__  # its annotations are resolved in the API's module
    return call


def _plain(value: Any) -> Any:
    """A result as JSON values: MathAPI answers with mpmath numbers, which Monty cannot take (tether could)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def tether_tools(functions: dict[str, dict[str, Callable[..., Any]]]) -> tuple[list[Any], list[str]]:
    """The functions as tether tools (read-only); the addresses tether could not make a tool of, and why."""
    from tether._sources.python import tool

    tools, failed = [], []
    for ns, fns in functions.items():
        for name, fn in fns.items():
            try:
                tools.append(tool(namespace=ns, read_only=True)(fn).__tether_tool__.to_tool())
            except Exception as exc:  # noqa: BLE001 - reported, and the turns that call it are left out
                failed.append(f"{ns}.{name}: {type(exc).__name__}: {exc}")
    return tools, failed


# --- programs -------------------------------------------------------------------------------------------------


def program(calls: list[str], involved: list[str], classes: dict[str, type]) -> tuple[str, set[str]]:
    """A turn's ground-truth calls as one program, and the addresses it calls."""
    lines, addresses = ["import tools", "out = []"], set()
    for text in calls:
        node = ast.parse(text, mode="eval").body
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), text
        name = node.func.id
        owner = next((c for c in involved if hasattr(classes[c], name)), None)
        if owner is None:
            raise LookupError(f"no involved API has {name}")
        params = [p for p in inspect.signature(getattr(classes[owner], name)).parameters if p != "self"]
        kwargs = [f"{params[i]}={ast.unparse(a)}" for i, a in enumerate(node.args)]
        kwargs += [f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords]
        ns = CLASSES[owner][1]
        addresses.add(f"{ns}.{name}")
        lines.append(f"out.append(await tools.{ns}.{name}({', '.join(kwargs)}))")
    lines.append("out")
    return "\n".join(lines) + "\n", addresses


def fresh_state(conv: dict[str, Any], classes: dict[str, type]) -> None:
    CURRENT.clear()
    for cls_name in conv["involved_classes"]:
        instance = classes[cls_name]()
        if cls_name not in STATELESS:
            instance._load_scenario(copy.deepcopy(conv["initial_config"].get(cls_name, {})), long_context=False)
        CURRENT[cls_name] = instance


# --- the run --------------------------------------------------------------------------------------------------


async def measure(convs: list[dict[str, Any]], classes: dict[str, type], warmup: int,
                  stream: bool = False) -> dict[str, Any]:
    import pydantic_monty as pm

    from tether._runtime import Runtime

    functions = api_functions(classes)
    tools, failed = tether_tools(functions)
    bad = {f.split(":")[0] for f in failed}
    modules = {"tools": pm.ExternalModule({ns: pm.ExternalModule(fns) for ns, fns in functions.items()})}
    turns: list[tuple[int, str]] = []  # (conversation, program)
    left_out = 0
    for i, conv in enumerate(convs):
        for calls in conv["turns"]:
            if not calls:
                continue  # a turn where the model is to ask, not call: nothing to run
            code, addresses = program(calls, conv["involved_classes"], classes)
            if addresses & bad:
                left_out += 1
                continue
            turns.append((i, code))
    samples: dict[str, list[float]] = {"bare": [], "tether": []}
    outcomes: dict[str, int] = {}
    # The baseline runs under tether's streamed-calls setting (common.stream_setting), as tether does.
    async with pm.AsyncMonty(min_processes=1, max_processes=2, stream_async_calls=stream) as pool, \
            Runtime(tools=tools) as rt:

        async def bare(code: str) -> Any:
            async with pool.checkout(external_modules=modules) as session:
                return await session.feed_run(code)

        async def teth(code: str) -> Any:
            r = await rt.execute(code)
            # By status, and a failure by its code: a turn tether refuses is a finding, not a timing.
            label = str(r.status) if not r.error else f"{r.status}: {r.error.get('code')}"
            outcomes[label] = outcomes.get(label, 0) + 1
            return r

        by_conv: dict[int, list[str]] = {}
        for i, code in turns:
            by_conv.setdefault(i, []).append(code)
        order = list(by_conv)
        for n, i in enumerate(order[:warmup] + order):
            measured = n >= warmup
            if measured and n == warmup:
                outcomes.clear()
            gc.collect()
            pair = [("bare", bare), ("tether", teth)]
            for name, fn in (pair if n % 2 == 0 else pair[::-1]):
                fresh_state(convs[i], classes)
                for code in by_conv[i]:
                    t = time.perf_counter()
                    await fn(code)
                    if measured:
                        samples[name].append(time.perf_counter() - t)
    ratios = [t / b for t, b in zip(samples["tether"], samples["bare"])]
    bare_s, teth_s = common.stats(samples["bare"]), common.stats(samples["tether"])
    return {
        "conversations": len(by_conv), "turns": len(samples["bare"]), "left_out_turns": left_out,
        "tools": len(tools), "tools_failed": failed, "tether_outcomes": outcomes,
        "calls_per_turn": _calls_histogram(convs),
        "rows": [{"contender": "bare", "label": "bare Monty feed_run (baseline)", **bare_s.ms()},
                 {"contender": "tether", "label": "tether execute, defaults", **teth_s.ms()}],
        "ratio": round(teth_s.p50 / bare_s.p50, 3), "paired_ratio": round(statistics.median(ratios), 3),
    }


def _calls_histogram(convs: list[dict[str, Any]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for conv in convs:
        for calls in conv["turns"]:
            out[len(calls)] = out.get(len(calls), 0) + 1
    return dict(sorted(out.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the first 50 conversations")
    p.add_argument("--conversations", type=int, default=None, help="how many conversations (default all 200)")
    common.add_stream_flag(p)
    args = p.parse_args()
    stream = common.stream_setting(args)
    loaded = load()
    if isinstance(loaded, str):
        print(f"bfcl: skipped: {loaded}")
        common.emit("bfcl", args.quick, {"skipped": loaded, "targets": []})
        return
    convs, classes = loaded
    n = args.conversations or (50 if args.quick else len(convs))
    out = asyncio.run(measure(convs[:n], classes, warmup=5 if args.quick else 10, stream=stream))
    print(f"bfcl v4 multi_turn_base ({BFCL_VERSION}): {out['conversations']} conversations, {out['turns']} turns "
          f"measured ({out['left_out_turns']} left out), calls per turn {out['calls_per_turn']}; streamed async "
          f"calls {'on' if stream else 'off'} for both")
    if out["tools_failed"]:
        print("tools tether could not build: " + "; ".join(out["tools_failed"]))
    print(f"tether outcomes: {out['tether_outcomes']}")
    rows = [{**r, "ratio": 1.0 if r["contender"] == "bare" else out["ratio"],
             "paired_ratio": 1.0 if r["contender"] == "bare" else out["paired_ratio"]} for r in out["rows"]]
    print(common.table(rows, common.RATIO_COLUMNS, title="one turn"))
    targets = [common.target("BFCL turn, tether defaults / bare Monty (paired)", out["paired_ratio"], TARGET_RATIO, "x")]
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("bfcl", args.quick, {**out, "stream_async_calls": stream, "targets": targets})


if __name__ == "__main__":
    main()

"""Search: a 10,000-tool catalog — index build, query latency, describe, stubs, execute at scale.

The catalog is generated (fixed seed): ~60 services as namespaces, each with
tools named verb_noun (some services in camelCase, as OpenAPI operation ids
come), descriptions of a few sentences and 1-7 typed parameters (strings,
integers, booleans, enums, arrays, nested objects).

Targets: index build <= 1 s; query p50 <= 2 ms over a mix of queries.

    python bench/search_bench.py [--quick] [--tools 10000]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import common
from tether._runtime import Runtime
from tether._tools.catalog import Catalog
from tether._tools.describe import describe
from tether._tools.model import Annotations, Tool
from tether._tools.search import SearchIndex, search
from tether._tools.stubs import build_stubs

BUILD_TARGET_S = 1.0
QUERY_TARGET_MS = 2.0

SERVICES = (
    "github gitlab bitbucket jira linear asana trello clickup monday notion confluence slack discord teams zoom "
    "gmail outlook calendar drive dropbox box onedrive salesforce hubspot pipedrive zendesk freshdesk intercom "
    "servicenow stripe paypal square quickbooks xero shopify woocommerce twilio sendgrid mailchimp datadog "
    "pagerduty sentry grafana cloudflare vercel netlify kubernetes docker aws_s3 aws_ec2 aws_lambda gcp_storage "
    "bigquery snowflake postgres mongodb redis elastic okta auth0 workday greenhouse figma airtable"
).split()
CAMEL_SERVICES = frozenset({"salesforce", "hubspot", "stripe", "shopify", "okta", "workday", "airtable", "figma"})
NOUNS = (
    "ticket issue pull_request comment repository branch commit release project task subtask board card sprint "
    "epic milestone label user team member channel message thread reaction meeting event invite calendar file "
    "folder document page space attachment contact lead account opportunity deal pipeline company customer "
    "invoice payment refund subscription plan coupon charge payout order product variant inventory cart "
    "shipment fulfillment sms call email template campaign audience list segment metric monitor dashboard "
    "alert incident service deployment domain dns_record certificate bucket object instance volume snapshot "
    "function log cluster pod namespace container image dataset table query job schema index record group "
    "role permission policy employee candidate application interview offer frame component webhook token"
).split()
VERBS = {
    "get": "Get one {n} by its id, with all of its fields.",
    "list": "List {n}s, newest first, optionally filtered; results are paged with a cursor.",
    "search": "Search {n}s by free text and filters; returns the best matches first.",
    "create": "Create a new {n}. Returns the created {n} with its id.",
    "update": "Update fields of an existing {n}; fields not given are left unchanged.",
    "delete": "Delete a {n} permanently. This cannot be undone.",
    "archive": "Archive a {n} so it no longer shows in default listings.",
    "restore": "Restore an archived or deleted {n}.",
    "assign": "Assign a {n} to a user or team.",
    "close": "Close a {n}, optionally with a resolution note.",
    "export": "Export {n}s as CSV or JSON for a date range.",
    "count": "Count {n}s matching the filters without fetching them.",
    "sync": "Synchronise {n}s from the upstream system now.",
    "merge": "Merge two {n}s into one, keeping the history of both.",
    "subscribe": "Subscribe to changes of a {n}; events are delivered to a webhook.",
}
READ_VERBS = frozenset({"get", "list", "search", "export", "count"})
EXTRA = (
    "Requires the {s} scope.", "Rate limited to 100 requests per minute.", "Timestamps are ISO 8601 in UTC.",
    "Deleted items are excluded unless include_deleted is true.", "Large results are truncated to 1,000 items.",
    "Use the cursor from the previous page to continue.", "Fields are returned as the {s} API names them.",
)
QUERIES = [
    "ticket", "invoice", "create ticket", "close an issue", "list open pull requests",
    "refund a payment to a customer", "send a slack message to a channel", "getTicket", "get_ticket",
    "subscr", "kubernetes pod logs", "how do I archive a project", "export invoices as csv",
    "assign task to team member", "search contacts by email", "cancel subscription",
    "restart deployment", "dns record", "upload file to folder", "calendar event invite",
    "xyzzy", "merge duplicate leads", "count open incidents", "webhook", "candidate interview feedback",
    'unbalanced "quote AND (paren -NEAR*', "s3 bucket object", "who is on call pagerduty",
    "please show me what tools can update a deal in the sales pipeline for the enterprise customer account "
    "before the end of the quarter and notify the account owner by email",
    "deleteRecord", "sync inventory", "stripe charge",
]
SCOPED = [("github", "issue"), ("stripe", "refund"), ("jira", "close"), ("slack", ""), ("okta", "user")]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _param(rng: random.Random, noun: str) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(("str", "str", "int", "bool", "enum", "array", "object"))
    if kind == "str":
        name = rng.choice(("name", "title", "query", "email", "note", "description", "owner", "url"))
        return name, {"type": "string", "description": f"The {noun}'s {name}."}
    if kind == "int":
        name = rng.choice(("limit", "priority", "amount", "days", "page_size", "quantity"))
        return name, {"type": "integer", "minimum": 0, "description": f"{name.replace('_', ' ')} of the {noun}."}
    if kind == "bool":
        name = rng.choice(("include_deleted", "notify", "dry_run", "force", "public"))
        return name, {"type": "boolean", "default": False}
    if kind == "enum":
        return "status", {"type": "string", "enum": ["open", "pending", "closed", "archived"]}
    if kind == "array":
        return "tags", {"type": "array", "items": {"type": "string"}, "description": "Labels to apply."}
    return "filter", {
        "type": "object",
        "properties": {"created_after": {"type": "string"}, "owner_id": {"type": "integer"},
                       "state": {"type": "string", "enum": ["open", "closed"]}},
        "description": f"Which {noun}s to match.",
    }


async def _handler(args: dict[str, Any]) -> Any:
    return {"ok": True, **args}


def make_catalog_tools(count: int, seed: int = 7) -> list[Tool]:
    """``count`` varied tools, deterministic for a given seed."""
    rng = random.Random(seed)
    tools: list[Tool] = []
    per_ns = -(-count // len(SERVICES))
    for service in SERVICES:
        nouns = rng.sample(NOUNS, k=min(len(NOUNS), per_ns // len(VERBS) + 2))
        pairs = [(v, n) for n in nouns for v in VERBS][:per_ns]
        for verb, noun in pairs:
            if len(tools) == count:
                return tools
            name = f"{verb}_{noun}"
            if service in CAMEL_SERVICES:
                name = _camel(name)
            desc = VERBS[verb].format(n=noun.replace("_", " ")) + " " + " ".join(
                e.format(s=service) for e in rng.sample(EXTRA, k=rng.randint(0, 2)))
            props: dict[str, Any] = {}
            required: list[str] = []
            if verb in ("get", "update", "delete", "archive", "restore", "assign", "close", "merge", "subscribe"):
                props[f"{noun}_id"] = {"type": "string", "description": f"Id of the {noun.replace('_', ' ')}."}
                required.append(f"{noun}_id")
            for _ in range(rng.randint(0, 6)):
                pname, schema = _param(rng, noun.replace("_", " "))
                props.setdefault(pname, schema)
            tools.append(Tool(
                namespace=service, name=name, description=desc.strip(),
                input_schema={"type": "object", "properties": props, "required": required},
                handler=_handler, title=f"{verb.title()} {noun.replace('_', ' ')}",
                annotations=Annotations(read_only=verb in READ_VERBS, destructive=verb == "delete"),
                source="openapi",
            ))
    return tools


def timed(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def query_latency(catalog: Catalog, rounds: int) -> tuple[list[float], dict[str, list[float]]]:
    """Every query of the mix once per round (rotating start), after one warm pass."""
    mix: list[tuple[str, str | None]] = [(q, None) for q in QUERIES] + [(q, ns) for ns, q in SCOPED]
    for q, ns in mix:  # warm: index built, statements prepared
        search(catalog, q, namespace=ns)
    per_query: dict[str, list[float]] = {f"{ns + ': ' if ns else ''}{q}": [] for q, ns in mix}
    all_samples: list[float] = []
    keys = list(per_query)
    for r in range(rounds):
        k = r % len(mix)
        for i in list(range(k, len(mix))) + list(range(k)):
            q, ns = mix[i]
            t = time.perf_counter()
            search(catalog, q, namespace=ns)
            dt = time.perf_counter() - t
            per_query[keys[i]].append(dt)
            all_samples.append(dt)
    return all_samples, per_query


async def execute_at_scale(big: Catalog, rounds: int, warmup: int) -> list[dict[str, Any]]:
    """The core program (type check off) with a 2-tool catalog vs the same tools inside the big catalog."""
    small_rt = Runtime(tools=common.bench_tools(), type_check=False)
    big_rt = Runtime(catalog=big, type_check=False)
    big_rt.add_tools(common.bench_tools())
    async with small_rt, big_rt:

        async def run(rt: Runtime) -> Any:
            r = await rt.execute(common.PROGRAM)
            if r.status != "completed":
                raise RuntimeError(f"run {r.status}: {r.error}")
            return r

        samples = await common.interleave({"small": lambda: run(small_rt), "big": lambda: run(big_rt)}, rounds,
                                          warmup)
        rows = common.ratio_rows(samples, "small", {
            "small": "execute, 2-tool catalog (type check off)",
            "big": f"execute, {len(big)}-tool catalog (type check off)"})
        t = time.perf_counter()
        r = await big_rt.execute(common.PROGRAM, type_check=True)
        first_tc = time.perf_counter() - t
        t = time.perf_counter()
        r = await big_rt.execute(common.PROGRAM, type_check=True)
        second_tc = time.perf_counter() - t
        rows.append({"label": f"execute, {len(big)}-tool catalog, type check on (first)",
                     "p50_ms": round(first_tc * 1e3, 1), "n": 1, "status": r.status})
        rows.append({"label": f"execute, {len(big)}-tool catalog, type check on (second)",
                     "p50_ms": round(second_tc * 1e3, 1), "n": 1, "status": r.status})
    return rows


def main() -> None:
    p = common.parser(__doc__.splitlines()[0], rounds=50, quick_rounds=5)
    p.add_argument("--tools", type=int, default=10_000, help="catalog size (default 10,000)")
    args = p.parse_args()
    rounds, warmup = common.rounds_of(args)
    reps = 3 if args.quick else 7

    t = time.perf_counter()
    tools = make_catalog_tools(args.tools)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    catalog = Catalog(tools)
    catalog_s = time.perf_counter() - t

    # Build: a fresh index over the same catalog, built by its first query (the public path).
    build = timed(lambda: SearchIndex(catalog).search("ticket"), reps)
    samples, per_query = query_latency(catalog, rounds)
    q = common.stats(samples)
    slowest = sorted(((statistics.median(v), k) for k, v in per_query.items()), reverse=True)[:5]

    # describe: the first call builds the stubs of the whole catalog (memoized until it changes).
    t = time.perf_counter()
    describe(catalog, tools[0].address)
    describe_first = time.perf_counter() - t
    rng = random.Random(3)
    addresses = [rng.choice(tools).address for _ in range(max(200, rounds * 20))]
    describe_s = []
    for a in addresses:
        t = time.perf_counter()
        describe(catalog, a)
        describe_s.append(time.perf_counter() - t)

    # Stubs for 1,000 tools (and the whole catalog): a fresh catalog each time, so nothing is memoized.
    sample_1k = random.Random(5).sample(tools, k=min(1000, len(tools)))
    stubs_1k = []
    for _ in range(reps):
        c = Catalog(sample_1k)
        t = time.perf_counter()
        build_stubs(c)
        stubs_1k.append(time.perf_counter() - t)
    c = Catalog(tools)
    t = time.perf_counter()
    stubs_all = build_stubs(c)
    stubs_all_s = time.perf_counter() - t
    stub_chars = sum(len(v) for v in stubs_all.namespace_modules.values())

    scale = asyncio.run(execute_at_scale(Catalog(tools), max(5, rounds // 2), warmup))

    ms = lambda s: round(s * 1e3, 3)  # noqa: E731
    rows = [
        {"what": f"generate {len(tools)} tools", "ms": ms(gen_s)},
        {"what": f"Catalog({len(tools)} tools)", "ms": ms(catalog_s)},
        {"what": f"search index build + first query, p50 of {reps}", "ms": ms(statistics.median(build))},
        {"what": f"query p50 ({len(samples)} queries, mix of {len(per_query)})", "ms": ms(q.p50)},
        {"what": "query p90", "ms": ms(q.p90)},
        {"what": "describe, first call (builds stubs for the whole catalog)", "ms": ms(describe_first)},
        {"what": f"describe one tool p50 ({len(describe_s)} calls)", "ms": ms(statistics.median(describe_s))},
        {"what": f"build_stubs, 1,000 tools, p50 of {reps}", "ms": ms(statistics.median(stubs_1k))},
        {"what": f"build_stubs, {len(tools)} tools ({stub_chars // 1024} KiB of stubs)", "ms": ms(stubs_all_s)},
    ]
    print(common.table(rows, [("what", f"search and catalog, {len(tools)} tools"), ("ms", "ms")]))
    print()
    print(common.table([{"query": k[:60], "p50_ms": ms(v)} for v, k in slowest],
                       [("query", "slowest queries"), ("p50_ms", "p50 ms")]))
    print()
    print(common.table(scale, common.RATIO_COLUMNS))
    targets = [
        common.target(f"search index build ({len(tools)} tools)", statistics.median(build), BUILD_TARGET_S, "s"),
        common.target("search query p50", q.p50 * 1e3, QUERY_TARGET_MS, "ms"),
    ]
    print()
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("search", args.quick, {
        "tools": len(tools), "rows": rows, "query": q.ms(),
        "slowest_queries": [{"query": k, "p50_ms": ms(v)} for v, k in slowest],
        "execute_at_scale": scale, "targets": targets,
    })


if __name__ == "__main__":
    main()

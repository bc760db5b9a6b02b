"""The model-facing description: complete enough to write a program, small, stable."""

from __future__ import annotations

import random

import pytest

from tether._tools import Catalog, Tool, model_description
from tether._tools.prompt import DEFAULT_BUDGET


async def _noop(args):
    return args


def _catalog(tools: int = 1000, namespaces: int = 50, order_seed: int | None = None) -> Catalog:
    made = [
        Tool(f"service_{i % namespaces:02d}", f"operation_number_{i}", f"Does thing {i}.", {"type": "object"}, _noop)
        for i in range(tools)
    ]
    if order_seed is not None:
        random.Random(order_seed).shuffle(made)
    catalog = Catalog()
    for t in made:
        catalog.add(t)
    return catalog


def test_big_catalog_fits_the_budget() -> None:
    text = model_description(_catalog())
    assert len(text.encode("utf-8")) <= 1200
    assert "… and " in text and "more namespaces: call sources()" in text
    assert "50 namespaces, 1000 tools" in text


def test_an_empty_catalog_says_so_without_a_list_left_open() -> None:
    """`tether prompt` before any tool is configured: the count line ends as a sentence, not with a colon
    introducing nothing."""
    text = model_description(Catalog())
    assert "0 namespaces, 0 tools.\n" in text and "tools:" not in text


def test_same_catalog_in_any_order_gives_identical_bytes() -> None:
    a = _catalog(order_seed=1)
    b = _catalog(order_seed=2)
    # Summaries set in different orders too.
    for ns in ["service_03", "service_01"]:
        a.set_namespace_summary(ns, f"Summary of {ns}")
    for ns in ["service_01", "service_03"]:
        b.set_namespace_summary(ns, f"Summary of {ns}")
    assert model_description(a).encode() == model_description(b).encode()


def test_states_the_api_and_the_subsets_gaps() -> None:
    text = model_description(_catalog(10, 2))
    for needed in [
        "import tools",
        "await tools.ns.tool(a, k=v)",
            "by position or keyword",
        "asyncio.gather(",
        "await search(query, namespace=None, limit=12, offset=0)",
        "await describe(",
        "await sources()",
        "last expression is the result",
        "print() goes to logs",
        "[code]",
        "approval",
        "custom exceptions",
        "super()",
        "generators",
        "del",
        "@property",
        "wait_for",
        "return_exceptions",
        "network",
        "json",
        "datetime",
        "statistics",
    ]:
        assert needed in text, needed


@pytest.mark.slow
async def test_every_module_the_prompt_names_is_importable_in_the_sandbox() -> None:
    from tether._sandbox.monty import SandboxPool, probe_names

    text = model_description(_catalog(3, 1))
    named = text.split("Modules: ", 1)[1].split(".", 1)[0].split()
    pool = SandboxPool()
    try:
        _, modules = await probe_names(pool)
    finally:
        await pool.close()
    assert named and set(named) <= set(modules), set(named) - set(modules)


def test_limits_are_stated() -> None:
    text = model_description(_catalog(3, 1), {"code_bytes": 1000, "host_calls": 7, "run_seconds": 2.5})
    assert "Limits: 1000 B code, 7 calls, 2.5 s." in text


def test_small_catalog_lists_every_namespace_with_summary() -> None:
    catalog = _catalog(6, 3)
    catalog.set_namespace_summary("service_01", "Billing: invoices and refunds")
    text = model_description(catalog)
    assert "service_01 (2): Billing: invoices and refunds\n" in text
    assert "service_00 (2): operation_number_0, operation_number_3\n" in text
    assert "more namespaces" not in text


def test_largest_namespaces_come_first_when_truncated() -> None:
    tools = [Tool("small", f"t{i}", "", {"type": "object"}, _noop) for i in range(2)]
    tools += [Tool("big", f"t{i}", "", {"type": "object"}, _noop) for i in range(30)]
    tools += [Tool(f"filler_{i:02d}", "t", "", {"type": "object"}, _noop) for i in range(40)]
    text = model_description(Catalog(tools))
    inventory = text.split("42 namespaces, 72 tools:\n", 1)[1].splitlines()
    # Too many for summaries: names with counts, most tools first, then a count of the rest.
    assert inventory[0].startswith("big (30), small (2), filler_00 (1), ")
    assert inventory[-1].startswith("… and ") and inventory[-1].endswith("more namespaces: call sources()")


def test_long_and_multibyte_summaries_are_clipped_without_breaking_utf8() -> None:
    catalog = _catalog(2, 1)
    catalog.set_namespace_summary("service_00", "é" * 500)
    text = model_description(catalog)
    line = next(line for line in text.splitlines() if line.startswith("service_00"))
    assert len(line.encode()) <= len("service_00 (2): ") + 90 and line.endswith("…")
    text.encode("utf-8").decode("utf-8")


def test_budget_is_respected_for_other_sizes() -> None:
    for n_ns in (1, 5, 20, 200):
        text = model_description(_catalog(n_ns * 3, n_ns))
        assert len(text.encode()) <= DEFAULT_BUDGET


def _named(spec: list[tuple[str, int, str]]) -> Catalog:
    catalog = Catalog(Tool(ns, f"t{i}", "", {"type": "object"}, _noop) for ns, count, _ in spec for i in range(count))
    for ns, _, summary in spec:
        catalog.set_namespace_summary(ns, summary)
    return catalog


# Summaries as the sources give them: an OpenAPI info.title, MCP server names and instructions, a docstring.
GITHUB_AND_THREE_MCP_SERVERS = [
    ("github", 1221, "GitHub's official OpenAPI spec + Octokit extension"),
    ("everything", 13, "mcp-servers/everything: This MCP server attempts to exercise all the features of the MCP protocol."),
    ("git", 12, "mcp-git: Read, search and change a local Git repository"),
    ("time", 2, "mcp-time: Time and timezone conversion"),
]
FIVE = [*GITHUB_AND_THREE_MCP_SERVERS, ("helpdesk", 6, "A help desk with customers, tickets and comments.")]


def test_every_namespace_is_named_with_count_and_summary() -> None:
    for spec in (GITHUB_AND_THREE_MCP_SERVERS, FIVE):
        text = model_description(_named(spec))
        assert len(text.encode()) <= DEFAULT_BUDGET
        assert "more namespaces" not in text
        lines = text.split(" tools:\n", 1)[1].splitlines()
        assert [line.split(" (")[0] for line in lines] == [ns for ns, _, _ in sorted(spec, key=lambda s: (-s[1], s[0]))]
        for line, (ns, count, summary) in zip(lines, sorted(spec, key=lambda s: (-s[1], s[0]))):
            head, _, shown = line.partition(": ")
            assert head == f"{ns} ({count})"
            # Each summary keeps a readable start of what its source says.
            assert len(shown) >= 16 and summary.startswith(shown.rstrip("…").rstrip())


def test_a_short_summary_is_kept_whole_and_long_ones_share_the_rest() -> None:
    text = model_description(_named(FIVE))
    assert "time (2): mcp-time: Time and timezone conversion\n" in text
    assert "github (1221): GitHub's" in text


def test_namespace_lines_are_byte_stable() -> None:
    shuffled = list(reversed(FIVE))
    assert model_description(_named(FIVE)).encode() == model_description(_named(shuffled)).encode()


def test_one_namespace_reads_as_one() -> None:
    """The demo's catalog, as every agent reads it: "1 namespace, 10 tools", not "1 namespaces"."""
    assert "\n1 namespace, 20 tools:\n" in model_description(_catalog(tools=20, namespaces=1))

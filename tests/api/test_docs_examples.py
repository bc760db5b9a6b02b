"""What README.md and the user docs show a user works as shown: each config block loads, each `tether ...`
command exists with the options given, and the Python examples run as written (a new user copies them)."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import run_cli

ROOT = Path(__file__).parent.parent.parent
# The documents a user reads; docs/decisions.md and protocol.md are records for maintainers.
USER_DOCS = ("README.md", "docs/deploy.md", "docs/mcp.md", "docs/security.md", "docs/notifications.md",
             "docs/integrations.md")
FENCED = re.compile(r"^( *)```(\w*)\n(.*?)^ *```", re.S | re.M)


def blocks(doc: str, lang: str) -> list[str]:
    return [textwrap.dedent(body) for _, kind, body in FENCED.findall((ROOT / doc).read_text()) if kind == lang]


def readme_python_block(after_heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(after_heading):]
    return textwrap.dedent(FENCED.search(section).group(3))  # type: ignore[union-attr]


@pytest.mark.parametrize("doc", USER_DOCS)
def test_every_toml_block_in_the_docs_loads(doc, tmp_path):
    from tether._config import load_config

    for text in blocks(doc, "toml"):
        path = tmp_path / "tether.toml"
        path.write_text(text)
        load_config(path, env={})  # raises ConfigError naming each bad key


@pytest.mark.parametrize("doc", USER_DOCS)
def test_every_python_and_json_block_in_the_docs_parses(doc):
    """Program snippets use top-level await as the sandbox does; client configs are JSON a client will read."""
    for text in blocks(doc, "python"):
        compile(text, doc, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for text in blocks(doc, "json"):
        json.loads(text)


# `[server] public_url` or `[log] format = "json"` in prose: a key a reader is told to set.
PROSE_KEY = re.compile(r"`\[([a-z_.]+)\] ([a-z_]+)(?: = ([^`]+))?`")
COMMENTED_KEY = re.compile(r"^( *)# ?([a-z_]+ = .*)$", re.M)


@pytest.mark.parametrize("doc", USER_DOCS)
def test_every_config_key_named_in_the_docs_prose_exists_and_takes_the_value_shown(doc, tmp_path):
    """A key named in a sentence is what a reader copies into tether.toml: it must exist, and a value shown
    with it (`a / b`: either) must load."""
    from tether._config import Config, load_config
    from tether.errors import ConfigError

    path, wrong = tmp_path / "tether.toml", {}
    for section, key, shown in PROSE_KEY.findall(FENCED.sub("", (ROOT / doc).read_text())):
        if section.split(".")[0] not in Config.model_fields:
            continue  # `[code] message`: not a config table
        for value in shown.split(" / ") if shown else ['"?"']:
            path.write_text(f"[{section}]\n{key} = {value}\n")
            try:
                load_config(path, env={})
            except ConfigError as exc:
                if shown or "unknown key" in str(exc):
                    wrong[f"[{section}] {key} = {value}"] = str(exc)
    assert wrong == {}


@pytest.mark.parametrize("doc", USER_DOCS)
def test_a_key_left_commented_out_in_a_toml_block_is_a_key_when_uncommented(doc, tmp_path):
    """`# audience = ...` in an example is an option the reader may turn on: it must be one tether knows."""
    from tether._config import load_config
    from tether.errors import ConfigError

    path, wrong = tmp_path / "tether.toml", {}
    for text in blocks(doc, "toml"):
        for commented in COMMENTED_KEY.finditer(text):
            line = commented.group(2).split("  #")[0]
            path.write_text(text[:commented.start()] + commented.group(1) + line + text[commented.end():])
            try:
                load_config(path, env={})
            except ConfigError as exc:  # another key's rule (url beside command) is fine; a misspelt key is not
                if "unknown key" in str(exc):
                    wrong[line] = str(exc)
    assert wrong == {}


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.*)$", FENCED.sub("", path.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", [*USER_DOCS, "docs/glossary.md"])
def test_every_link_in_the_docs_reaches_its_file_and_heading(doc):
    """`[Guarded writes](#guarded-writes-writes--guard)`, `docs/security.md#doors-and-rights`: a heading renamed
    leaves the links to it pointing nowhere."""
    path, broken = ROOT / doc, []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCED.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest)):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("doc", [*USER_DOCS, "docs/glossary.md"])
def test_every_repository_file_the_docs_name_exists(doc):
    """`bench/check_bench.py`, `tests/server/test_replicas.py`, `_server/mcp.py`: where a reader is sent to look."""
    text = (ROOT / doc).read_text()
    named = set(re.findall(r"(?<![\w/.])((?:tests|bench|examples|deploy)/[\w./@-]+\.(?:py|json|yml|service|md))", text))
    named |= {"src/tether/" + p for p in re.findall(r"`(_[a-z_]+/[a-z_/]+\.py)`", text)}
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []


def test_the_readme_config_example_is_valid(tmp_path):
    from tether._config import load_config

    # The OAuth steps' snippet, the configuration section's example, guarded writes (P-45), the idempotency
    # one, then the undo one.
    oauth, block, guarded, keyed, undo = blocks("README.md", "toml")
    path = tmp_path / "tether.toml"
    path.write_text(block)
    config = load_config(path)
    assert [s.type for s in config.sources] == ["python", "mcp", "openapi"]
    assert config.policy.rules[0].match == "helpdesk.add_*"
    assert config.auth is not None and config.auth.rights["approve"].values == ["tether-approvers"]
    path.write_text(oauth)
    config = load_config(path)
    assert config.auth is not None and config.auth.console_client_secret_env == "TETHER_CONSOLE_SECRET"
    path.write_text(keyed)
    config = load_config(path)
    assert [(s.type, s.idempotency) for s in config.sources] == [("openapi", "key"), ("mcp", "key")]
    path.write_text(guarded)
    config = load_config(path)
    assert config.policy.writes == "guard" and config.policy.allowlist[0] == "*@mycompany.com"
    assert config.sources[0].trust_tools == {"get_contacts": "trusted"}
    path.write_text(undo)
    config = load_config(path)
    (github,) = config.sources
    assert github.undo["create_issue"].tool == "github.update_issue"  # P-46


def shown_commands(doc: str) -> list[str]:
    """Every `tether ...` a user is shown: inline code and the lines of shell blocks."""
    text = (ROOT / doc).read_text()
    found = []
    for _, kind, body in FENCED.findall(text):
        if kind in ("sh", ""):
            for line in body.splitlines():
                line = line.strip().removeprefix("$ ")
                command = re.match(r"(?:[A-Z_]+=\S+\s+)*(tether [a-z].*)$", line)  # after VAR=value, if any
                if command:
                    found.append(command.group(1).split(" #")[0])
    prose = FENCED.sub("", text)
    found += [" ".join(span.split()) for span in re.findall(r"`(tether [a-z][^`]*)`", prose)]
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_parts(command: str, root: argparse.ArgumentParser) -> list[str]:
    """The subcommands and options of ``command`` the CLI does not have (alternatives as `a|b` or `a/b`)."""
    words = command.replace("\\|", "|").split()[1:]
    parsers, wrong = [root], []
    for word in words:
        choices = _subcommands(parsers[0])
        if not choices or not re.fullmatch(r"[a-z]+([|/][a-z]+)*", word):
            break
        names = re.split(r"[|/]", word)
        wrong += [n for n in names if n not in choices]
        parsers = [choices[n] for n in names if n in choices] or parsers
        if wrong:
            return wrong
    known = {o for p in (root, *parsers) for a in p._actions for o in a.option_strings}
    options = re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", command)
    return [o for o in options if o not in known]


@pytest.mark.parametrize("doc", USER_DOCS)
def test_every_tether_command_the_docs_show_exists(doc):
    from tether.cli import build_parser

    root = build_parser()
    commands = shown_commands(doc)
    assert commands or doc == "docs/security.md"
    assert {c: unknown_parts(c, root) for c in commands if unknown_parts(c, root)} == {}


def test_every_tether_command_a_message_tells_the_user_to_run_exists():
    """Errors' next actions, pause texts and help name commands (`tether runs list`, "(tether sources list)"):
    a user follows them as written, so each must be one the CLI has, with those options."""
    from tether.cli import build_parser

    root, named = build_parser(), {}
    verbs = "|".join(_subcommands(root))
    command = re.compile(rf"`(tether [a-z][^`]*)`|[(\"'](tether (?:{verbs})(?: [a-z-]+)?(?: --[a-z-]+)*)")
    for path in (ROOT / "src" / "tether").rglob("*.py"):
        for quoted, bare in command.findall(path.read_text()):
            named[" ".join((quoted or bare).split())] = path.name
    assert len(named) > 20
    assert {c: (where, unknown_parts(c, root)) for c, where in named.items() if unknown_parts(c, root)} == {}


def test_the_command_check_sees_a_command_that_does_not_exist():
    from tether.cli import build_parser

    root = build_parser()
    assert unknown_parts("tether runs approve RUN --seq N", root) == ["approve"]
    assert unknown_parts("tether resume RUN_ID --approve --seq N --as OWNER", root) == []
    assert unknown_parts("tether runs await\\|cancel\\|signal", root) == []
    assert unknown_parts("tether run PROGRAM.py [--tools X] [--json] [--no-check] [--no-wait]", root) == ["--no-wait"]


def declared_tools(text: str) -> tuple[str, ast.Module] | None:
    """A snippet's imports and its ``@tool`` functions alone (the lines around them need a run), with the
    namespace its ``undo="ns.tool"`` names (the functions' module name decides it, as in a user's module)."""
    tree = compile(text, "<snippet>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    decorated = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and any("tool" in ast.unparse(d).split("(")[0] for d in node.decorator_list)]
    if not decorated:
        return None
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    undo = re.search(r'undo="(\w+)\.', text)
    return (undo.group(1) if undo else "docs"), ast.Module(body=[*imports, *decorated], type_ignores=[])


@pytest.mark.parametrize("doc", USER_DOCS)
def test_every_tool_the_docs_declare_is_accepted_and_loads_into_a_runtime(doc):
    """`@tool(...)` with the options a snippet shows (trust labels, roles, undo, idempotent_with_key, a
    CallContext argument) is declared as written, and a runtime takes the snippet's tools together."""
    import asyncio

    from tether import Runtime

    for text in blocks(doc, "python"):
        found = declared_tools(text)
        if found is None:
            continue
        namespace, module = found
        scope: dict = {"__name__": namespace}
        exec(compile(module, doc, "exec"), scope)  # noqa: S102 - the docs' own snippet
        functions = [value for value in scope.values() if hasattr(value, "__tether_tool__")]
        assert functions, text

        async def load(functions: list = functions) -> list[str]:
            async with Runtime(tools=functions) as rt:
                return [hit["address"] for hit in rt.search("", limit=100)["results"]]

        assert len(asyncio.run(load())) == len(functions), text


def test_the_readme_python_api_example_runs_as_written(tmp_path):
    """Copied into a file and run: the write pauses, the loop approves it, the run completes."""
    script = tmp_path / "example.py"
    script.write_text(readme_python_block("## Python API"))
    env = {**os.environ, "TETHER_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "completed open"


def readme_block_containing(marker: str) -> str:
    (found,) = [text for text in blocks("README.md", "python") if marker in text]
    return found


async def test_the_readme_fragments_on_a_runtime_run_as_written():
    """The README's fragments that use a runtime (`rt`, `code`, `program`, `run_id`), run in turn on one with
    the demo's tools: begin and stream events to a pause; decide writes 3 and 4 together with actor and via;
    a retry with the same run key gets the same run; a run given the user's words."""
    from tether import Runtime
    from tether.demo.helpdesk import make_helpdesk

    code = (  # reads at seqs 1 and 2, then two writes issued together at 3 and 4, as the decide fragment names
        "import asyncio\nimport tools\n"
        "await tools.helpdesk.get_ticket(ticket_id='T1004')\nawait tools.helpdesk.list_comments(ticket_id='T1004')\n"
        "await asyncio.gather(tools.helpdesk.add_comment(ticket_id='T1004', body='On it'),\n"
        "                     tools.helpdesk.add_comment(ticket_id='T1001', body='On it'))\n'done'\n")
    async with Runtime(tools=make_helpdesk()) as rt:
        scope: dict = {"rt": rt, "code": code, "program": code}

        async def run(marker: str) -> None:
            text = readme_block_containing(marker)
            body = "async def _fragment():\n" + textwrap.indent(text, "    ") + "\n    return locals()\n"
            exec(compile(body, "README.md", "exec"), scope)  # noqa: S102 - the README's own fragment
            scope.update(await scope["_fragment"]())

        await run("handle = await rt.begin(code)")
        assert scope["result"].status == "paused" and scope["result"].pending["seq"] == 3
        scope["run_id"] = scope["handle"].run_id
        await run("for w in rt.pending(run_id):")
        # 3 was sent; 4, declined, raised at its call, which the program does not catch.
        assert scope["result"].status == "failed" and scope["result"].error["code"] == "write_declined"
        assert scope["result"].error["details"]["call"]["seq"] == 4
        await run('result = await rt.execute(code, key="3f1c…")')
        await run("user_words=")
        assert scope["result"].status == "paused"


def test_the_readme_program_runs_against_the_demo_tools_as_the_readme_says(tmp_path):
    """The model-facing example, saved as program.py and run with the demo's tools: it pauses at its write,
    and the `tether resume` line printed at the pause finishes it."""
    (tmp_path / "program.py").write_text(readme_python_block("## The program's view"))
    env = {**os.environ, "TETHER_HOME": str(tmp_path / "home")}
    env.pop("TETHER_STORE_URL", None)
    env.pop("TETHER_CONFIG", None)
    paused = run_cli(["run", "program.py", "--tools", "tether.demo.helpdesk", "--no-prompt"], env, tmp_path)
    assert paused.returncode == 3, paused.stdout + paused.stderr
    approve = re.search(r"approve: (tether resume \S+ --approve --seq \d+)", paused.stdout + paused.stderr)
    assert approve is not None, paused.stdout + paused.stderr
    done = run_cli([*approve.group(1).split()[1:], "--json"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["result"] == {"open": 14}


@pytest.mark.parametrize("example", ["pydantic_ai_approval.py", "langgraph_approval.py", "openai_agents_approval.py"])
def test_each_framework_example_runs_offline_as_written(example, tmp_path):
    """docs/integrations.md: each framework's example, run as a user runs it, with the framework's own test
    model: the write waits, showing its arguments; a fresh runtime approves it; the agent reads the result."""
    env = {**os.environ, "TETHER_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("waiting for approval: helpdesk.add_comment ") and "On it: Add a second admin" in lines[0]
    assert lines[-1] == 'completed: "open"'

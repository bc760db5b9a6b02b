"""The command line, as a user runs it: a real store on disk; real processes where the process boundary
is the point (pause here, resume there; a terminal; a closed pipe), the rest through ``main()`` in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli

FIXTURES = Path(__file__).parent.parent / "fixtures"
TETHER = [sys.executable, "-m", "tether.cli"]



@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["TETHER_HOME"] = str(tmp_path / "home")
    e["NOTES_FILE"] = str(tmp_path / "notes.jsonl")
    e.pop("TETHER_STORE_URL", None)
    return e


def tether(args, env, cwd, stdin=None):
    """In its own process."""
    return subprocess.run(TETHER + args, env=env, cwd=cwd, capture_output=True, text=True, input=stdin, timeout=120)


def cli(args, env, cwd, stdin=None):
    """In this process."""
    return run_cli(args, env, cwd, stdin)


@pytest.mark.slow
def test_p10_pause_in_one_process_resume_from_another(tmp_path, env):
    program = tmp_path / "prog.py"
    program.write_text(
        "import tools\n"
        "before = await tools.notes.list_notes()\n"
        "await tools.notes.add_note(text='hello')\n"
        "{'before': len(before), 'after': len(await tools.notes.list_notes())}\n"
    )
    # Paused here, in this process; resumed in a process of its own.
    first = cli(["run", str(program), "--tools", str(FIXTURES / "notes_tools.py"), "--json"], env, tmp_path)
    assert first.returncode == 3, first.stderr
    paused = json.loads(first.stdout)
    assert paused["status"] == "paused"
    assert paused["pending"]["address"] == "notes.add_note"
    assert not Path(env["NOTES_FILE"]).exists()  # nothing sent

    # Another process, no --tools: the run recorded which tools it used.
    second = tether(["resume", paused["run_id"], "--approve", "--json"], env, tmp_path)
    assert second.returncode == 0, second.stderr
    done = json.loads(second.stdout)
    assert done["status"] == "completed"
    assert done["result"] == {"before": 0, "after": 1}
    assert Path(env["NOTES_FILE"]).read_text().count("hello") == 1

    again = cli(["resume", paused["run_id"], "--approve", "--json"], env, tmp_path)
    assert json.loads(again.stdout)["result"] == done["result"]
    assert Path(env["NOTES_FILE"]).read_text().count("hello") == 1

    shown = cli(["runs", "show", paused["run_id"], "--json"], env, tmp_path)
    timeline = json.loads(shown.stdout)
    assert [(c["address"], c["state"]) for c in timeline["calls"]] == [
        ("notes.list_notes", "done"), ("notes.add_note", "sent"), ("notes.list_notes", "done")]
    listed = cli(["runs", "list", "--json"], env, tmp_path)
    assert [r["status"] for r in json.loads(listed.stdout)] == ["completed"]


def test_run_exit_codes_and_human_output(tmp_path, env):
    ok = tmp_path / "ok.py"
    ok.write_text("print('hi')\n1 + 1\n")
    r = cli(["run", str(ok)], env, tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines() == ["hi", "2"]
    bad = tmp_path / "bad.py"
    bad.write_text("1/0\n")
    r = cli(["run", str(bad)], env, tmp_path)
    assert r.returncode == 1
    assert "program_error" in r.stderr and "ZeroDivisionError" in r.stderr
    r = cli(["run", str(tmp_path / "missing.py")], env, tmp_path)
    assert r.returncode == 2 and "cannot read program" in r.stderr
    r = cli(["resume", "run_nope", "--approve"], env, tmp_path)
    assert r.returncode == 2 and "run_not_found" in r.stderr


def test_the_check_rejects_a_wrong_argument_before_running(tmp_path, env):
    # The default check (calls) names the argument, with its line, before anything runs.
    prog = tmp_path / "typo.py"
    prog.write_text("import tools\nawait tools.notes.add_note(txt='x')\n")
    r = cli(["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py"), "--json"], env, tmp_path)
    out = json.loads(r.stdout)
    assert r.returncode == 1
    assert out["error"]["code"] == "invalid_arguments"
    assert "unknown argument 'txt'" in out["error"]["message"] and out["error"]["details"]["line"] == 2
    assert out["calls"] == 0
    assert not Path(env["NOTES_FILE"]).exists()
    r = cli(["run", str(prog), "--no-check", "--tools", str(FIXTURES / "notes_tools.py"), "--json"], env, tmp_path)
    out = json.loads(r.stdout)
    assert out["error"]["code"] == "invalid_arguments" and out["calls"] == 1  # refused at the boundary instead
    # A positional call runs through the CLI.
    prog.write_text("import tools\nawait tools.notes.add_note('x')\n'ok'\n")
    r = cli(["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py"), "--json", "--no-prompt"], env, tmp_path)
    assert json.loads(r.stdout)["status"] in ("completed", "paused"), r.stdout


def test_demo_runs(tmp_path, env):
    r = cli(["demo"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "host calls" in r.stdout


def test_tools_search_and_describe(tmp_path, env):
    r = cli(["tools", "search", "close ticket", "--tools", "tether.demo.helpdesk", "--json"], env, tmp_path)
    found = json.loads(r.stdout)
    assert found["results"][0]["address"] == "helpdesk.close_ticket"
    r = cli(["tools", "describe", "helpdesk.close_ticket", "--tools", "tether.demo.helpdesk"], env, tmp_path)
    assert r.returncode == 0 and "async def" in r.stdout and "ticket_id" in r.stdout
    r = cli(["tools", "describe", "helpdesk.close_tiket", "--tools", "tether.demo.helpdesk"], env, tmp_path)
    assert r.returncode == 1 and "did you mean" in r.stdout and "helpdesk.close_ticket" in r.stdout


def test_bad_config_is_one_clear_error_per_key(tmp_path, env):
    (tmp_path / "tether.toml").write_text("[limits]\nhost_calls = -1\n[limts]\nx = 1\n")
    r = cli(["run", "-"], env, tmp_path, stdin="1")
    assert r.returncode == 2
    assert "limits.host_calls" in r.stderr and "did you mean 'limits'" in r.stderr


@pytest.mark.slow
def test_in_a_terminal_run_asks_y_n_at_a_pause(tmp_path, env):
    """A real pseudo-terminal: the user types y and the write is sent; no resume needed."""
    import pty
    import select

    prog = tmp_path / "ask.py"
    prog.write_text("import tools\nawait tools.notes.add_note(text='typed yes')\n'done'\n")
    main, child = pty.openpty()
    proc = subprocess.Popen(TETHER + ["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py")],
                            env=env, cwd=tmp_path, stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    seen = b""
    try:
        deadline = 60
        import time as _time

        end = _time.monotonic() + deadline
        while b"[y/N]" not in seen and _time.monotonic() < end:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                seen += os.read(main, 4096)
        assert b"Allow write notes.add_note(text=\"typed yes\")? [y/N]" in seen
        os.write(main, b"y\n")
        assert proc.wait(timeout=60) == 0
        while True:
            ready, _, _ = select.select([main], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(main, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    assert b"done" in seen
    assert Path(env["NOTES_FILE"]).read_text().count("typed yes") == 1


def _notes(env) -> list[str]:
    path = Path(env["NOTES_FILE"])
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


def test_p28_repeating_the_printed_resume_line_does_not_decide_the_next_write(tmp_path, env):
    prog = tmp_path / "two.py"
    prog.write_text("import tools\nawait tools.notes.add_note(text='a')\nawait tools.notes.add_note(text='b')\n'done'\n")
    first = cli(["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py")], env, tmp_path)
    assert first.returncode == 3, first.stderr
    line = next(x for x in first.stdout.splitlines() if x.strip().startswith("approve:"))
    command = line.split("approve:", 1)[1].split()
    assert command[:2] == ["tether", "resume"] and "--seq" in command  # the pause names its write
    r = cli(command[1:], env, tmp_path)
    assert r.returncode == 3 and "call 2: notes.add_note(text=\"b\")" in r.stdout
    again = cli(command[1:], env, tmp_path)  # the retry, the double click
    assert again.returncode == 3 and "call 2: notes.add_note(text=\"b\")" in again.stdout
    assert _notes(env) == ["a"]
    # Without --seq, outside a terminal, it would be a guess: refused with what waits.
    blind = cli(command[1:4], env, tmp_path)
    assert blind.returncode == 2 and "seq_required" in blind.stderr and "call 2 notes.add_note" in blind.stderr
    assert _notes(env) == ["a"]


def test_p27_a_gathered_batch_is_listed_and_decided_per_write_from_the_cli(tmp_path, env):
    prog = tmp_path / "batch.py"
    prog.write_text(
        "import asyncio\nimport tools\n"
        "async def add(t):\n"
        "    try:\n"
        "        await tools.notes.add_note(text=t)\n"
        "        return 'sent ' + t\n"
        "    except Exception as e:\n"
        "        return str(e)\n"
        "await asyncio.gather(add('x'), add('y'), add('z'))\n")
    first = cli(["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py")], env, tmp_path)
    assert first.returncode == 3, first.stderr
    assert "3 writes issued together" in first.stdout
    for text, seq in (("x", 1), ("y", 2), ("z", 3)):
        assert f"call {seq}: notes.add_note(text=\"{text}\")" in first.stdout
    run_id = first.stdout.split()[2]
    r = cli(["resume", run_id, "--approve", "--seq", "2"], env, tmp_path)
    assert r.returncode == 3 and "[approved]" in r.stdout and _notes(env) == []
    r = cli(["resume", run_id, "--decline", "--seq", "1", "--seq", "3", "--reason", "one is enough", "--json"],
               env, tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["result"]
    assert out[1] == "sent y" and out[0].startswith("[write_declined]") and "one is enough" in out[2]
    assert _notes(env) == ["y"]
    shown = cli(["runs", "show", run_id], env, tmp_path)
    assert "decided: call 2 approve by" in shown.stdout and "via cli" in shown.stdout


@pytest.mark.slow
def test_p28_resume_without_seq_at_a_terminal_shows_the_write_and_asks(tmp_path, env):
    """The person at the terminal sees the exact write before the decision is taken for it."""
    import pty
    import select
    import time as _time

    prog = tmp_path / "two.py"
    prog.write_text("import tools\nawait tools.notes.add_note(text='a')\nawait tools.notes.add_note(text='b')\n'done'\n")
    first = cli(["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py"), "--json"], env, tmp_path)
    run_id = json.loads(first.stdout)["run_id"]
    assert cli(["resume", run_id, "--approve", "--seq", "1"], env, tmp_path).returncode == 3

    main, child = pty.openpty()
    proc = subprocess.Popen(TETHER + ["resume", run_id, "--approve"], env=env, cwd=tmp_path,
                            stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    seen = b""
    try:
        end = _time.monotonic() + 60
        while b"[y/N]" not in seen and _time.monotonic() < end:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                seen += os.read(main, 4096)
        assert b"approve call 2: notes.add_note(text=\"b\")? [y/N]" in seen
        os.write(main, b"y\n")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    assert _notes(env) == ["a", "b"]


def test_sources_list_shows_the_summaries_a_program_gets(tmp_path, env):
    r = cli(["sources", "list", "--tools", "tether.demo.helpdesk"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("helpdesk ("))
    summary = line.split("): ", 1)[1]
    assert summary.startswith("A small help desk, in memory")
    program = tmp_path / "p.py"
    program.write_text("[s['summary'] for s in await sources()]\n")
    r = cli(["run", str(program), "--tools", "tether.demo.helpdesk", "--json"], env, tmp_path)
    assert json.loads(r.stdout)["result"] == [summary]
    r = cli(["prompt", "--tools", "tether.demo.helpdesk"], env, tmp_path)
    assert "helpdesk (" in r.stdout and summary[:20] in r.stdout


@pytest.mark.slow
def test_a_reader_that_stops_early_gets_no_traceback(tmp_path, env):
    # `tether tools search ticket | head -1`: the pipe closes before tether
    # writes; the command ends quietly with what the reader took.
    proc = subprocess.Popen([sys.executable, "-m", "tether.cli", "tools", "search", "ticket", "--tools",
                             "tether.demo.helpdesk"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=tmp_path)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.slow
def test_p36_run_again_with_its_key_continues_a_killed_run_and_sends_nothing_twice(tmp_path, env):
    # The first `tether run --key` is SIGKILLed mid-program; the same command again gets that run,
    # taken over from the dead process (P-36, P-11), not a second run that writes the notes again.
    prog = tmp_path / "slow.py"
    prog.write_text(
        "import asyncio\nimport tools\n"
        "for i in range(4):\n"
        "    await tools.notes.add_note(text='n' + str(i))\n"
        "    await asyncio.sleep(0.4)\n"
        "len(await tools.notes.list_notes())\n"
    )
    (tmp_path / "tether.toml").write_text('[policy]\nwrites = "allow"\n')
    args = ["run", str(prog), "--tools", str(FIXTURES / "notes_tools.py"), "--key", "job-1", "--json"]
    first = subprocess.Popen(TETHER + args, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    notes = Path(env["NOTES_FILE"])
    deadline = time.monotonic() + 60
    while not (notes.exists() and len(notes.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and first.poll() is None, "the first run never wrote"
        time.sleep(0.05)
    first.kill()
    first.wait()
    again = cli(args, env, tmp_path)
    out = json.loads(again.stdout)
    texts = [json.loads(line)["text"] for line in notes.read_text().splitlines()]
    assert len(texts) == len(set(texts)), f"a note was written twice: {texts}"
    if out["status"] == "completed":
        assert out["result"] == 4 and texts == ["n0", "n1", "n2", "n3"]
    else:  # killed between a write's sending mark and its outcome: reported, never re-sent
        assert out["error"]["code"] == "write_outcome_unknown", out
    listed = json.loads(cli(["runs", "list", "--json"], env, tmp_path).stdout)
    assert [r["run_id"] for r in listed] == [out["run_id"]]


def test_p36_start_with_a_key_queues_one_run_and_refuses_another_program(tmp_path, env):
    prog = tmp_path / "job.py"
    prog.write_text("1 + 1\n")
    args = ["start", str(prog), "--no-worker", "--key", "nightly-2026-12-01", "--json"]
    first = json.loads(cli(args, env, tmp_path).stdout)
    second = json.loads(cli(args, env, tmp_path).stdout)
    assert first["run_id"] == second["run_id"] and second["status"] == "queued"
    prog.write_text("2 + 2\n")
    refused = cli(args, env, tmp_path)
    error = json.loads(refused.stdout)["error"]
    assert refused.returncode == 2 and error["code"] == "idempotency_conflict"
    assert error["details"]["run_id"] == first["run_id"] and first["run_id"] in error["message"]
    listed = json.loads(cli(["runs", "list", "--json"], env, tmp_path).stdout)
    assert [r["run_id"] for r in listed] == [first["run_id"]]


def test_every_command_and_option_says_what_it_does_in_help():
    """A new user's first reference is `tether X --help`: no subcommand or option is listed bare."""
    import argparse

    from tether.cli import build_parser

    bare = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions}
                for name, child in action.choices.items():
                    if name not in helped:
                        bare.append(f"{path} {name}")
                    walk(child, f"{path} {name}")
            elif action.option_strings and not action.help:
                bare.append(f"{path} {action.option_strings[0]}")

    walk(build_parser(), "tether")
    assert bare == []


def test_a_mistyped_status_is_a_usage_error_naming_the_real_ones(tmp_path, env):
    r = cli(["runs", "list", "--status", "done"], env, tmp_path)
    assert r.returncode == 2 and "completed" in r.stderr and "paused" in r.stderr


@pytest.mark.parametrize("args", [["prompt"], ["demo"], ["tools", "search", "ticket", "--tools", "tether.demo.helpdesk"],
                                  ["store", "stats"], ["runs", "list"], ["sources", "list"]])
def test_json_output_is_json_alone(tmp_path, env, args):
    """`--json` is for scripts: what it prints parses as one JSON document, with no text around it."""
    r = cli([*args, "--json"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)

"""Running a framework app (tests/frameworks/*_app.py) as a process of its own, and killing it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
AGENTS = ROOT / "tests" / "frameworks"


def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TETHER_HOME": str(tmp_path / "home"),
            "DESK_SENT": str(tmp_path / "sent.jsonl")}


def spawn(app: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(AGENTS / app), *args], cwd=ROOT, env=env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_when_paused(proc: subprocess.Popen[str], seconds: float = 120) -> None:
    """Wait for the app to say its run paused, then SIGKILL it (no cleanup runs, as in a crash)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + seconds
    line = proc.stdout.readline()  # the app prints one line when paused, or exits
    assert line.strip() == "paused", f"{line!r}: {proc.communicate(timeout=10)[1][-3000:]}"
    assert time.monotonic() < deadline
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def finished(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])

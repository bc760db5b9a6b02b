"""A script using the Python API exits 0, every time (D-23).

Before the fix about one run in ten of this script ended with SIGABRT (exit
134) at interpreter shutdown, after its work was done. Fifty runs, closed and
not closed, must all exit 0 with their output intact.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "fixtures" / "api_exit_script.py"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("args, runs", [([], 35), (["--no-close"], 15)])
def test_python_api_script_exits_cleanly_every_time(args, runs):
    codes = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
        codes.append(proc.returncode)
        assert proc.stdout.strip() == "6", proc.stderr
    assert codes == [0] * runs

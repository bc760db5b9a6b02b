"""A process that approves a paused run's write and continues the run, then stalls in it, to be killed there.

    continued.py STORE_URL RUN_ID PRINCIPAL

The run's tools are tests/fixtures/notes_tools.py; NOTES_STALL_SECONDS makes its `stall` read wait, so the
process is still the run's owner, mid-run, after the approved write was sent (tests/engine/test_repeats.py).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tether._app import open_runtime

TOOLS = str(Path(__file__).parent.parent / "fixtures" / "notes_tools.py")


async def main(store_url: str, run_id: str, principal: str) -> None:
    async with open_runtime(tools=[TOOLS], type_check=False, store_url=store_url) as rt:
        await rt.resume(run_id, "approve", seq=1, principal=principal)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

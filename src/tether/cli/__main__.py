"""``python -m tether.cli``: the command line, its exit code the process's.

A normal exit: the sandbox pool waits for Monty's last deliveries when it
closes (tether._sandbox.monty, D-23), so interpreter shutdown is safe.
"""

import sys

from tether.cli import main

sys.exit(main())

"""Phase marks of the start-up benchmark's scripts: ``mark(name)`` prints the seconds since
the benchmark launched the process (``STARTUP_T0``, a ``time.time()``), one line each."""

import os
import time

T0 = float(os.environ.get("STARTUP_T0", time.time()))


def mark(name):
    print(f"phase {name} {time.time() - T0:.3f}", flush=True)

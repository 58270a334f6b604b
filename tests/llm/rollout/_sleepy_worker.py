"""A judge-pool worker for the tests: sleeps ``float(completion)`` seconds, then scores ``completion == gold``.

Light to import (no Math-Verify), so a test of the pool's scheduling pays no library start-up.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection


def sleepy_worker(conn: Connection) -> None:  # pragma: no cover - runs in a child process
    conn.send("ready")
    while True:
        try:
            gold, completion = conn.recv()
        except EOFError:
            return
        time.sleep(float(completion))
        conn.send(("ok", float(completion == gold)))

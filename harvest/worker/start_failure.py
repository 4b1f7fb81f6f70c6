"""The one line a worker that failed to start leaves for `harvest serve` to print.

A harvest check that can only run inside SGLang's scheduler process (its KV pool, the admin port bound at
start-up) fails there, two processes below the CLI. The supervisor names a file in the environment the
worker inherits; the scheduler writes the reason into it and exits; the supervisor raises it as the CLI's
error.
"""

import os
from pathlib import Path

START_FAILURE_ENV = "HARVEST_START_FAILURE_FILE"


def report_start_failure(message: str) -> None:
    path = os.environ.get(START_FAILURE_ENV)
    if path:
        Path(path).write_text(message)


def read_start_failure() -> str | None:
    path = os.environ.get(START_FAILURE_ENV)
    if not path or not os.path.exists(path):
        return None
    return Path(path).read_text().strip() or None

"""What to call this host's processor in a profile."""

import platform
from pathlib import Path


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"

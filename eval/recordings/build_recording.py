"""Rebuilds cpu-smollm2-135m.json.gz from the step and unit records under eval/results/ (README.md here says
what each part is). Run from the repository root: python eval/recordings/build_recording.py"""

import gzip
import json
from pathlib import Path

RESULTS = Path("eval/results")
OUT = Path("eval/recordings/cpu-smollm2-135m.json.gz")

# Decode alone (no job, or the job paused), in this order: a quiet host with a 1.9 s stall, the slow loaded
# host of the robust-estimate e2e run, the host the batch-spread e2e ran on, a quiet host again.
DECODE_SOURCES = (
    ("cpu-2026-11-23/decode-beside-paused-job/steps.json", "solo"),
    ("cpu-2026-11-25/e2e-robust-estimate/steps.json", "solo"),
    ("cpu-2026-11-26/batch-spread/e2e/steps.json.gz", "solo"),
    ("cpu-2026-11-24/e2e-slo-runs/growth-bound-run1.steps.json.gz", "solo"),
)
UNIT_SOURCE = "cpu-2026-11-26/unit-spread/log1.json.gz"
UNIT_BOUND_MS = 18.6  # log_units.py cut units to this bound
HOST_STALL_AT, HOST_STALL_MS = 500, 1460.0
"""The unit-spread log has no unit over 175 ms: one unit of the job's second optimizer step, the 500th (a
recompute, 9.0 ms as recorded; every kind timed by then), is stalled to 1.46 s, the idle-time unit the host
stalled in the bursty temporal row of eval/results/cpu-2026-11-23/NOTES.md ("With a robust unit estimate", run 2,
"steps up to 3.8 s")."""


def load(path: Path):
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


def main() -> None:
    decode = []
    for path, key in DECODE_SOURCES:
        decode += [[s["batch_size"], s["kv_tokens"], round(s["latency_ms"], 3)] for s in load(RESULTS / path)[key]]
    units = [[kind, round(ms, 3), tokens] for kind, ms, tokens in load(RESULTS / UNIT_SOURCE)["units"]]
    assert units[HOST_STALL_AT][0] == "recompute", units[HOST_STALL_AT]
    units[HOST_STALL_AT][1] = HOST_STALL_MS
    recording = {
        "name": "cpu-smollm2-135m (eval/recordings/README.md)",
        "sources": {"decode_steps": [f"{p} [{k}]" for p, k in DECODE_SOURCES], "units": UNIT_SOURCE,
                    "injected": f"unit {HOST_STALL_AT} (recompute) set to {HOST_STALL_MS} ms: a host stall"},
        "max_unit_ms": UNIT_BOUND_MS,
        "decode_steps": decode,
        "units": units,
    }
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:  # mtime 0: the same bytes on every rebuild
        f.write(json.dumps(recording, separators=(",", ":")).encode())
    print(f"{OUT}: {len(decode)} decode steps, {len(units)} units, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()

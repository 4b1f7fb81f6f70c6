"""Trace replay (issue 7): simulated per co-location policy, or live against a running `harvest serve`.

`harvest replay ... --out DIR` writes DIR/results.json; its schema is in eval/README.md, "results.json".
"""

from harvest.replay.live_replay import LiveReplay
from harvest.replay.replay_simulation import ReplaySimulation

__all__ = ["LiveReplay", "ReplaySimulation"]

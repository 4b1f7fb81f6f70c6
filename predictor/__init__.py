"""Two-stage decode-latency predictor (HARLI sec. 5) and the per-step SM split planner built on it."""

from predictor.latency_model import LatencyModel
from predictor.profile import Profile
from predictor.split_planner import SplitPlanner

__all__ = ["LatencyModel", "Profile", "SplitPlanner"]

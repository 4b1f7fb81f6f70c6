"""Request traces for replay: the shipped Azure 2023 traces, CSV loading, synthetic arrivals."""

from traces.synthetic_trace import SyntheticTrace
from traces.trace import Trace
from traces.trace_loader import load_trace

__all__ = ["SyntheticTrace", "Trace", "load_trace"]

"""`harvest profile`: measure decode steps through a real worker, fit and write the latency profile."""

from harvest.profiler.decode_profiler import DecodeProfiler

__all__ = ["DecodeProfiler"]

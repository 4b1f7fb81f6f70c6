"""Benchmarks of the whole worker (`harvest bench serve`); the subsystems keep their own `bench.py`."""

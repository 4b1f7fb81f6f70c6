"""The flags every bench that drives live decode workers shares (colocate, fleet, slo), so one flag means one
thing in all of them; a bench that wants other defaults sets them with `parser.set_defaults`."""

import argparse


def add_worker_arguments(parser: argparse.ArgumentParser, log_dir: str) -> None:
    """The workers a bench starts: their model, KV pool, start-up limit and where their logs go."""
    parser.add_argument("--model-path", default=None, help="HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool tokens (SGLang flag)")
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    parser.add_argument("--log-dir", default=log_dir, help=f"worker logs, the job's output (default {log_dir})")


def add_replay_arguments(parser: argparse.ArgumentParser, with_target: bool = True) -> None:
    """The requests a live replay sends a worker: their shape, how many at once, how long the unfinished are
    waited for; and the TPOT target, except where the bench derives its own (`with_target=False`)."""
    if with_target:
        parser.add_argument("--tpot-ms", type=float, default=300.0, help="TPOT target in ms (default 300, as the demo)")
    parser.add_argument("--max-context-tokens", type=int, default=256)
    parser.add_argument("--max-generated-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8,
                        help="most requests in flight per worker (default %(default)s)")
    parser.add_argument("--drain-s", type=float, default=120.0)

"""`harvest replay`: replay a request trace live against a running worker, or simulate it per policy.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import dataclasses


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a request trace, live against `harvest serve` or simulated per policy",
        description="Replay a trace (shipped: conv, code; a CSV TIMESTAMP,ContextTokens,GeneratedTokens; or "
        "poisson:rate=5,duration=600,seed=0 / gamma:rate=5,cv=3,duration=600,seed=0) either live against a "
        "running `harvest serve` (--target) or as a discrete-event simulation of the decode worker driven by a "
        "latency profile (--simulate). Writes DIR/results.json and PNG plots, and prints a comparison table.",
    )
    parser.add_argument("--trace", required=True, help="conv, code, a CSV path, or a synthetic spec")
    parser.add_argument("--window", default=None, help="replay only this long a stretch, e.g. 600s or 10m")
    parser.add_argument("--window-start", default="0", help="where the window starts in the trace (default 0)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="arrive k times as fast (default 1)")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="cap each request's context")
    parser.add_argument("--max-generated-tokens", type=int, default=None, help="cap each request's output")
    parser.add_argument("--out", required=True, help="output folder for results.json and the plots")
    parser.add_argument("--tpot-ms", type=float, default=40.0, help="TPOT target in ms (default 40, as HARLI)")
    parser.add_argument("--no-plots", action="store_true", help="write results.json only")
    live = parser.add_argument_group("live mode")
    live.add_argument("--target", default=None, help="URL of a running `harvest serve` (SGLang port)")
    live.add_argument("--admin", default="http://127.0.0.1:30100", help="its admin URL (default :30100)")
    live.add_argument("--concurrency", type=int, default=64, help="most requests in flight (default 64)")
    live.add_argument(
        "--drain-s",
        type=float,
        default=300.0,
        help="wait this long after the last arrival, then cancel what is unfinished (default 300)",
    )
    sim = parser.add_argument_group("simulated mode")
    sim.add_argument("--simulate", action="store_true", help="simulate instead of sending requests")
    sim.add_argument(
        "--profile",
        default=None,
        help="latency profile JSON (default: the shipped SYNTHETIC H100 profile, not measured)",
    )
    sim.add_argument("--policy", default="all", choices=["separate", "static", "harvest", "temporal", "oracle", "all"])
    sim.add_argument("--with-oracle", action="store_true",
                     help="also run the oracle: per step the best candidate with the device's true latency")
    sim.add_argument(
        "--memory", default=None, help="device memory preset (h100-llama3-8b; cpu-smollm2-135m; default by profile)"
    )
    sim.add_argument("--kv-capacity-tokens", type=int, default=None, help="override the KV pool size")
    sim.add_argument("--static-share", type=float, default=0.6, help="static's decode share (default 0.6)")
    sim.add_argument("--max-running-requests", type=int, default=256)
    sim.add_argument(
        "--latency-noise",
        type=float,
        default=0.0,
        help="log-normal sigma between profile and simulated device (default 0: exact)",
    )
    sim.add_argument(
        "--recording", default=None,
        help="decode and unit times recorded on real workers, replayed in place of the noise (e.g. "
        "eval/recordings/cpu-smollm2-135m.json.gz; eval/recordings/README.md)",
    )
    sim.add_argument(
        "--plan-margin", type=float, default=0.0,
        help="override: harvest and temporal plan for target * (1 - margin) (default 0: temporal plans for the "
        "target, harvest learns its margin online)"
    )
    sim.add_argument("--seed", type=int, default=0)
    jobs = parser.add_argument_group("job-arrival trace (simulated mode)")
    jobs.add_argument(
        "--jobs", default=None,
        help="finetune jobs arriving beside the requests: a JSONL file (arrival_s, name, total_tokens, deadline_s, "
        "priority per line) or synthetic:N,load=L,seed=S; the harvest policy runs them under the scheduler, FIFO "
        "and one-at-a-time and reports deadlines met, tokens trained and steps in target",
    )
    jobs.add_argument("--job-switch-s", type=float, default=2.0,
                      help="finetune time lost per switch between jobs (window re-fetch; default 2)")
    jobs.add_argument("--job-restart-s", type=float, default=60.0,
                      help="one-at-a-time's worker restart between jobs, no finetune meanwhile (default 60)")
    fleet = parser.add_argument_group("a fleet of decode workers training one adapter (simulated mode)")
    fleet.add_argument(
        "--decode-workers", metavar="N[,N...]", default=None,
        help="simulate fleets of N harvest workers (e.g. 1,2,8,64), each on its own load, averaging one adapter "
        "in rounds as `harvest serve --fleet` does; reports rounds per hour, tokens per round, fleet tokens/s, "
        "steps in target and the rounds' sync cost (results.json's fleet section)",
    )
    fleet.add_argument("--fleet-load", default="round-robin", choices=["round-robin", "replica"],
                       help="round-robin: the window's requests dealt to the workers as a round-robin router does "
                       "(default); replica: every worker replays the whole window (traffic growing with the fleet)")
    fleet.add_argument("--fleet-round-tokens", type=int, default=None, help="a worker starts a round after this "
                       "many trained tokens")
    fleet.add_argument("--fleet-round-s", type=float, default=None,
                       help="a worker starts a round after this many seconds (default 60 if neither is given)")
    fleet.add_argument("--fleet-link-gbps", type=float, default=None,
                       help="each member's all-reduce bandwidth in Gbit/s (default 10: gloo over TCP between hosts)")
    fleet.add_argument("--fleet-round-latency-ms", type=float, default=None,
                       help="a round's fixed time: quorum, fingerprints, commit vote (default 50)")
    fleet.add_argument("--fleet-adapter-bytes", type=int, default=None,
                       help="bytes a round all-reduces (default: the memory preset's model, LoRA rank 8 on all "
                       "seven projections, fp32)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harvest.replay.replay_run import ReplayRunConfig, run_replay

    config = ReplayRunConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ReplayRunConfig)})
    console = Console(stderr=True)
    results, written = run_replay(config, console)
    console.print(f"wrote {', '.join(str(p) for p in written)} ({results['wall_s']:.1f} s)")
    return 0

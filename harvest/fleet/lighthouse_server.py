"""`python -m harvest.fleet.lighthouse_server --bind HOST:PORT`: torchft's lighthouse as a process of its own, run
until SIGTERM or SIGINT. `harvest deploy --decode-workers N` owns one for its fleet; its members join it by
`harvest serve --fleet http://HOST:PORT`. Its HTTP page /status answers once it listens.

Deferred imports: torchft only when the lighthouse starts.
"""

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harvest.fleet.lighthouse_server")
    parser.add_argument("--bind", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--min-replicas", type=int, default=1, help="members a quorum needs (default 1)")
    # As tests/test_fleet_live.py: a round does not wait long for a late member, a dead one leaves in 2 s.
    parser.add_argument("--join-timeout-ms", type=int, default=500)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=2000)
    args = parser.parse_args(argv)
    from torchft._torchft import LighthouseServer

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        server = LighthouseServer(bind=args.bind, min_replicas=args.min_replicas, join_timeout_ms=args.join_timeout_ms,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    except RuntimeError as e:  # torchft's error for a taken or malformed address
        print(f"lighthouse: error: cannot listen on {args.bind}: {e}", file=sys.stderr)
        return 2
    print(f"lighthouse: listening on {args.bind}", file=sys.stderr, flush=True)
    while not stopping.wait(1.0):
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

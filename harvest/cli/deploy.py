"""`harvest deploy`: start a plain SGLang prefill worker, `harvest serve` as the decode worker and sglang-router
in PD mode on one host, with mooncake moving the KV cache between the workers (over TCP on loopback without an
RDMA device, over --ib-device with one). With --decode-workers N > 1 and a --finetune job the decode workers
train the job as one fleet (torchft lighthouse started here, shard K/N each). Prints the router URL; Ctrl-C or
SIGTERM stops everything. Flags not listed here go to `harvest serve` (e.g. --finetune JOB.yaml --tpot-slo-ms
300).

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import signal
import sys
from pathlib import Path

from harvest.cli.model_flag import add_worker_parser


PORTS = (
    ("--router-metrics-port", 29000, "router Prometheus port"),
    ("--prefill-port", 30010, "prefill worker port"),
    ("--bootstrap-port", 8998, "prefill KV bootstrap port"),
    ("--decode-port", 30001, "decode worker port; worker K takes this + K"),
    ("--admin-port", 30100, "harvest admin port; worker K takes this + K"),
    ("--first-transfer-port", 31000, "first of the 100 x (1 + N) ports mooncake's RPC may use"),
    ("--lighthouse-port", 29510, "the fleet's torchft lighthouse (N > 1 with --finetune)"),
)
"""Every port the deployment binds besides the router's own (--port), with its default."""


def add_parser(subparsers) -> None:
    parser = add_worker_parser(
        subparsers, "deploy", run, description=__doc__.split("\n\n")[0],
        help="run prefill worker + harvest decode worker(s) + sglang-router on this host (real KV transfer)")
    parser.add_argument("--host", default="127.0.0.1", help="address every process binds (default 127.0.0.1)")
    parser.add_argument("--port", "--router-port", dest="router_port", type=int, default=30000,
                        help="router port, where clients send requests (default 30000)")
    for flag, default, what in PORTS:
        parser.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    parser.add_argument("--decode-workers", type=int, default=1,
                        help="harvest decode workers behind the router; with --finetune and N > 1 they train the job "
                        "as one fleet (default 1)")
    parser.add_argument("--ib-device", default=None,
                        help="RDMA device for the KV transfer, e.g. mlx5_0 (GPU hosts; default: TCP)")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="KV pool of each worker (default 16384)")
    parser.add_argument("--log-dir", default="runs/deploy", help="folder for the three logs (default runs/deploy)")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0, help="per process (default 600)")
    parser.add_argument("--kv-bootstrap-timeout-s", type=int, default=60,
                        help="the prefill worker fails a request whose decode worker has not taken its KV by then, so "
                        "the router retries or answers it (SGLang's default 300; default 60)")


def run(args: argparse.Namespace) -> int:

    from harvest.deploy import DeployConfig
    from harvest.deploy.pd_deployment import prepare_deployment, wait_until_stopped
    from harvest.models import EMBEDDED_MODEL_PLACEHOLDER

    config = DeployConfig(
        model_path=args.model_path or EMBEDDED_MODEL_PLACEHOLDER, log_dir=Path(args.log_dir), host=args.host,
        router_port=args.router_port, router_metrics_port=args.router_metrics_port, prefill_port=args.prefill_port,
        bootstrap_port=args.bootstrap_port, decode_port=args.decode_port, admin_port=args.admin_port,
        first_transfer_port=args.first_transfer_port, decode_workers=args.decode_workers,
        lighthouse_port=args.lighthouse_port, ib_device=args.ib_device,
        max_total_tokens=args.max_total_tokens, serve_args=tuple(args.passthrough),
        startup_timeout_s=args.startup_timeout_s, kv_bootstrap_timeout_s=args.kv_bootstrap_timeout_s,
    )
    deployment = prepare_deployment(config)
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)
        if deployment.router.proc is None:  # still starting: unwind start(), which stops what it started
            raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    print(f"harvest deploy: starting prefill, {config.decode_workers} decode and router; logs in {config.log_dir}",
          file=sys.stderr)
    try:
        deployment.start()
        admins = " ".join(d.admin_url for d in deployment.decodes)
        decodes = ", ".join(d.url for d in deployment.decodes)
        fleet = f", fleet lighthouse {deployment.lighthouse_url}" if deployment.lighthouse else ""
        print(f"router {deployment.url}   decode admin {admins}   "
              f"(prefill {deployment.prefill.url}, decode {decodes}{fleet})", flush=True)
        by_request = wait_until_stopped(deployment, lambda: bool(stopping),
                                        lambda problem: print(f"harvest deploy: error: {problem}", file=sys.stderr))
    finally:
        codes = deployment.stop()
    print(f"harvest deploy: stopped (exit codes {codes})", file=sys.stderr)
    return 0 if by_request and deployment.prefill_exit_code is None else 1

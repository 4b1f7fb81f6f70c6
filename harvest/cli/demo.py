"""`harvest demo`: the whole story on the embedded default model, on any machine (a CPU is enough).

1. `harvest deploy` on the embedded SmolLM2-135M: a plain SGLang prefill worker, `harvest serve` as the decode
   worker with the demo LoRA job inside under a TPOT target, and sglang-router; mooncake moves the KV;
2. one question through the router, its real answer printed; then a live replay of a stretch of the Azure
   conv trace through the router (scaled to what a CPU serves): comparison table, results.json and plots;
   the decode worker's stats, finetune section included; the job publishes its adapter every
   PUBLISH_EVERY_STEPS optimizer steps into both workers, and the question goes once more with the
   published adapter (SGLang's `lora_path`) and once without;
3. a clean stop (the job checkpoints its adapter, all three processes exit);
4. a simulated replay of the full one-hour conv trace for every policy.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import signal
import time
from pathlib import Path

import yaml

DEMO_JOB = Path(__file__).resolve().parents[1] / "finetune" / "demo" / "demo.yaml"
DEMO_QUESTION = "What is the capital of France? Answer in one sentence."
DEMO_ADAPTER = "harvest-demo"
PUBLISH_EVERY_STEPS = 10


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the end-to-end demo on the embedded model")
    parser.add_argument("--model-path", default=None, help="HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--out", default="runs/demo", help="folder for logs, results, plots and the adapter")
    parser.add_argument("--tpot-slo-ms", type=float, default=300.0,
                        help="decode latency target (default 300: a 2-core CPU decodes a step in ~100 ms)")
    parser.add_argument("--window", default="20s",
                        help="stretch of the conv trace to replay live (default 20s: at x0.1, about 200 s of replay)")
    parser.add_argument("--rate-scale", type=float, default=0.1, help="live replay rate scale (default 0.1)")
    parser.add_argument("--port", type=int, default=30000, help="router port (default 30000)")
    parser.add_argument("--admin-port", type=int, default=30100, help="harvest admin port (default 30100)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harvest.deploy.pd_deployment import prepare_deployment
    from harvest.cli.main import main as harvest_main
    from harvest.cli.status import print_stats_table
    from harvest.deploy import DeployConfig
    from harvest.models import resolve_model_path
    from harvest.worker.client import chat, read_stats

    console = Console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(args.model_path)
    job = yaml.safe_load(DEMO_JOB.read_text())
    job.update(model_name_or_path=str(model_path), dataset_dir=str(DEMO_JOB.parent),
               output_dir=str((out / "adapter").resolve()), max_steps=10_000,
               publish_every_steps=PUBLISH_EVERY_STEPS, publish_name=DEMO_ADAPTER)
    job_path = out / "demo-job.yaml"
    job_path.write_text(yaml.safe_dump(job))

    console.rule("1. harvest deploy: SGLang prefill worker + harvest decode worker (LoRA job inside) + router")
    with console.status("starting prefill, decode and router (a minute or two on a CPU) ..."):
        started = time.perf_counter()
        deployment = prepare_deployment(DeployConfig(
            model_path=str(model_path), log_dir=out, router_port=args.port, admin_port=args.admin_port,
            serve_args=("--finetune", str(job_path), "--tpot-slo-ms", str(args.tpot_slo_ms)),
        )).start()
    console.print(f"ready in {time.perf_counter() - started:.0f} s: router {deployment.url}, "
                  f"admin {deployment.admin_url}, logs in {out}")
    try:
        console.rule("2. a question through the router: prefilled, KV transferred, decoded by harvest")
        console.print(f"[bold]Q:[/bold] {DEMO_QUESTION}\n[bold]A:[/bold] {chat(deployment.url, DEMO_QUESTION)}")
        console.rule(f"   live replay through the router: {args.window} of the conv trace at x{args.rate_scale}")
        harvest_main(["replay", "--trace", "conv", "--window", args.window, "--rate-scale", str(args.rate_scale),
                      "--max-context-tokens", "256", "--max-generated-tokens", "32", "--concurrency", "8",
                      "--drain-s", "120", "--tpot-ms", str(args.tpot_slo_ms), "--target", deployment.url,
                      "--admin", deployment.admin_url, "--out", str(out / "live")])
        print_stats_table(read_stats(deployment.admin_url), console)
        show_published_adapter(deployment, console)
    finally:
        console.rule("3. stop: the finetune job checkpoints, every process exits")
        codes = deployment.stop()
    console.print(f"exit codes {codes}; adapter checkpoints in {out / 'adapter'}")
    if codes["prefill"] == -signal.SIGKILL and not deployment.prefill.killed:
        console.print("prefill -9: SGLang's own server ends its graceful drain by killing itself "
                      "(sglang.srt.utils.kill_process_tree); harvest did not have to kill it")
    console.rule("4. simulated replay of the full one-hour conv trace, every policy")
    return harvest_main(["replay", "--trace", "conv", "--simulate", "--out", str(out / "sim")])


def show_published_adapter(deployment, console) -> None:
    """The question once with the adapter the job published (its last version) and once without. The job is
    paused first and its last requested version waited for, so the answer shown is that version's."""
    import httpx

    from harvest.worker.client import chat, read_stats

    admin = f"{deployment.admin_url}/harvest"
    httpx.post(f"{admin}/finetune/pause", timeout=60).raise_for_status()
    deadline = time.monotonic() + 300
    while (published := read_stats(deployment.admin_url)["finetune"]["published"])["version"] \
            != published["version_requested"] and time.monotonic() < deadline:
        time.sleep(0.5)
    if published["version"] == 0:  # no publish_every_steps boundary reached yet: publish the last step now
        response = httpx.post(f"{admin}/finetune/publish", timeout=300)
        if response.status_code != 200:
            console.print(f"[red]no adapter to show ({response.status_code}): {response.json().get('detail')}")
            return
        published = response.json()
    console.rule(f"   the published adapter {published['name']!r}: version {published['version']}, "
                 f"optimizer step {published['step']}")
    console.print(f"[bold]Q:[/bold] {DEMO_QUESTION}")
    console.print(f"[bold]A (lora_path={published['name']!r}):[/bold] "
                  f"{chat(deployment.url, DEMO_QUESTION, lora_path=published['name'])}")
    console.print(f"[bold]A (base model):[/bold] {chat(deployment.url, DEMO_QUESTION)}")

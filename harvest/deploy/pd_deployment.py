"""Start, watch and stop the processes of a one-host PD deployment: a prefill worker, N decode workers
(`harvest serve`), sglang-router over all of them, and with a finetune job and N > 1 a torchft lighthouse that
makes the decode workers one fleet training the job (harvest/deploy/fleet_workers.py).

Order: the lighthouse first (the workers join it at start), then the prefill worker and the decode workers
side by side, each health-checked; then the router, which must reach them. A stop goes the other way: the
router first (no new requests), then the decode workers (drain, checkpoint the finetune job), the prefill
worker, the lighthouse; each process and its children are reaped, so nothing outlives the deployment.

Deferred imports: the job's LlamaFactory arguments and LoRA flags are imported only where a deployment carries a
finetune job, since `harvest --help` imports this module.
"""

import dataclasses
import importlib.util
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from base.argv import flag_value
from base.errors import HarvestError
from base.ports import check_port_free
from base.system_libs import library_path_with_system_libs
from harvest.deploy.fleet_lighthouse import lighthouse_process, start_lighthouse
from harvest.deploy.fleet_workers import check_fleet_flags, is_fleet, worker_serve_args
from harvest.models import resolve_model_path
from harvest.sglang.pd_flags import (
    NUM_TRANSFER_PORTS,
    decode_flags,
    prefill_command,
    prefill_env,
    router_command,
    worker_env,
)
from harvest.worker.process import WorkerProcess, free_ports

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class DeployConfig:
    model_path: str
    log_dir: Path
    host: str = "127.0.0.1"
    """Address every process binds; the deployment is one host, so loopback unless clients are remote."""
    router_port: int = 30000
    """Where clients send requests (SGLang's /generate and OpenAI routes)."""
    router_metrics_port: int = 29000
    """The router's Prometheus endpoint."""
    prefill_port: int = 30010
    bootstrap_port: int = 8998
    """The prefill worker's KV bootstrap server (SGLang's default port)."""
    decode_port: int = 30001
    """Decode worker K listens on decode_port + K."""
    admin_port: int = 30100
    """harvest's admin API on decode worker K: admin_port + K."""
    first_transfer_port: int = 31000
    """mooncake's RPC ports: the prefill worker takes the first hundred from here, each decode worker the next."""
    decode_workers: int = 1
    """How many `harvest serve` decode workers; with a finetune job and more than one, they train it as a fleet."""
    lighthouse_port: int = 29510
    """The fleet's torchft lighthouse (torchft's default port); unused without a fleet."""
    ib_device: str | None = None
    """RDMA device for the KV transfer (GPU hosts); none means mooncake's TCP transport."""
    max_total_tokens: int | None = 16384
    """KV pool size of both workers (SGLang's --max-total-tokens)."""
    serve_args: tuple[str, ...] = ()
    """Further flags for `harvest serve` (the finetune job, the TPOT target, SGLang flags)."""
    startup_timeout_s: float = 300.0
    kv_bootstrap_timeout_s: int = 60
    """Seconds the prefill worker waits for a decode worker to take a request's KV before it fails the request."""
    prefill_lora_flags: tuple[str, ...] = ()
    """SGLang's LoRA flags for the prefill worker when the decode worker's job publishes its adapter (set by
    prepare_deployment from the job): the prefill worker loads every version, and the decode worker is told
    its URL (`harvest serve --publish-to`)."""

    def __post_init__(self):
        if self.decode_workers < 1:
            raise HarvestError(f"--decode-workers must be >= 1, got {self.decode_workers}")
        if self.kv_bootstrap_timeout_s < 1:
            raise HarvestError(f"--kv-bootstrap-timeout-s must be >= 1, got {self.kv_bootstrap_timeout_s}")
        check_fleet_flags(self.serve_args, self.decode_workers)
        ports = self.ports()
        for flag, port in ports.items():
            if not 0 < port < 65536:
                raise HarvestError(f"{flag} {port} is not a usable TCP port")
        num_transfer = (1 + self.decode_workers) * NUM_TRANSFER_PORTS
        if not 0 < self.first_transfer_port <= 65536 - num_transfer:
            raise HarvestError(f"--first-transfer-port {self.first_transfer_port} leaves no room for "
                               f"{num_transfer} ports below 65536")
        seen: dict[int, str] = {}
        for flag, port in ports.items():
            if port in seen:
                raise HarvestError(f"the deployment's ports must differ: {seen[port]} and {flag} are both {port}")
            seen[port] = flag
        transfer = range(self.first_transfer_port, self.first_transfer_port + num_transfer)
        clash = [flag for flag, port in ports.items() if port in transfer]
        if clash:
            raise HarvestError(f"{', '.join(clash)} inside the transfer ports {transfer.start}-{transfer.stop - 1}")

    @property
    def is_fleet(self) -> bool:
        return is_fleet(self.serve_args, self.decode_workers)

    def ports(self) -> dict[str, int]:
        """Every port the deployment binds but mooncake's, by the flag that sets it (decode worker K: "+K")."""
        ports = {"--router-port": self.router_port, "--router-metrics-port": self.router_metrics_port,
                 "--prefill-port": self.prefill_port, "--bootstrap-port": self.bootstrap_port}
        for k in range(self.decode_workers):
            suffix = f"+{k}" if self.decode_workers > 1 else ""
            ports[f"--decode-port{suffix}"] = self.decode_port + k
            ports[f"--admin-port{suffix}"] = self.admin_port + k
        if self.is_fleet:
            ports["--lighthouse-port"] = self.lighthouse_port
        return ports


def free_deploy_ports(decode_workers: int = 1) -> list[int]:
    # Decode worker K takes decode/admin port + K: free_ports keeps its ports more than 10 apart.
    """Seven free ports for a deployment of `decode_workers` decode workers (router, metrics, prefill, bootstrap,
    decode, admin, first transfer port), none of the ports it binds inside the transfer ports' range."""
    num_transfer = (1 + decode_workers) * NUM_TRANSFER_PORTS
    while True:
        ports = free_ports(7)
        bound = [*ports[:4], *(ports[p] + k for p in (4, 5) for k in range(decode_workers))]
        if not any(ports[6] <= port < ports[6] + num_transfer for port in bound):
            return ports


def prefill_lora_flags(serve_args: tuple[str, ...], is_cpu_host: bool) -> tuple[str, ...]:
    """The job's LoRA flags for the prefill worker when the decode worker's job publishes its adapter (a
    request naming it is prefilled with it), none otherwise. A job that does not parse gives none: `harvest
    serve` names its problem and the deployment stops."""
    job_path = flag_value(list(serve_args), "--finetune")
    if job_path is None:
        return ()
    from harvest.finetune.llamafactory_args import LlamaFactoryArgs
    from harvest.sglang.lora_flags import lora_flags_for

    try:
        llamafactory = LlamaFactoryArgs.from_yaml(job_path)
        return () if llamafactory.publishing is None else tuple(lora_flags_for(llamafactory, [], is_cpu_host))
    except HarvestError:
        return ()


class PDDeployment:
    def __init__(self, config: DeployConfig, is_cpu_host: bool, env: dict[str, str] | None = None):
        """`env`: added to each process's environment (the CLI passes LD_LIBRARY_PATH with the driver stub
        and the transfer engine's system libraries)."""
        self.config = config
        c, env = config, env or {}
        self.prefill = WorkerProcess(
            [], c.prefill_port, 0, c.log_dir / "prefill.log",
            command=prefill_command(c.model_path, c.host, c.bootstrap_port, is_cpu_host, c.ib_device,
                                    c.max_total_tokens, c.prefill_lora_flags),
            env={**env, **worker_env(is_cpu_host, c.first_transfer_port), **prefill_env(c.kv_bootstrap_timeout_s)},
        )
        self.lighthouse = None
        if c.is_fleet:
            self.lighthouse = lighthouse_process(c.host, c.lighthouse_port, c.log_dir / "lighthouse.log", env)
        max_tokens = [] if c.max_total_tokens is None else ["--max-total-tokens", str(c.max_total_tokens)]
        # Every decode worker publishes into the prefill worker too: N publishers of one name there (see README).
        publish_to = ["--publish-to", self.prefill.url] if c.prefill_lora_flags else []
        self.decodes = []
        for k in range(c.decode_workers):
            serve_args = list(c.serve_args)
            if c.is_fleet:
                serve_args = worker_serve_args(c.serve_args, k, c.decode_workers, self.lighthouse_url, c.log_dir)
            log = c.log_dir / ("decode.log" if c.decode_workers == 1 else f"decode-{k}.log")
            self.decodes.append(WorkerProcess(
                ["--model-path", c.model_path, *max_tokens, *decode_flags(c.host, c.ib_device), *serve_args,
                 *publish_to],
                c.decode_port + k, c.admin_port + k, log,
                env={**env, **worker_env(is_cpu_host, c.first_transfer_port + (1 + k) * NUM_TRANSFER_PORTS)},
            ))
        self.decode = self.decodes[0]
        self.router = WorkerProcess(
            [], c.router_port, 0, c.log_dir / "router.log",
            command=router_command(c.host, c.router_metrics_port, self.prefill.url, c.bootstrap_port,
                                   [d.url for d in self.decodes], int(c.startup_timeout_s)),
            env=env,
        )
        self.prefill_exit_code: int | None = None
        self.exited: set[str] = set()  # names check() has reported

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def admin_url(self) -> str:
        return self.decode.admin_url

    @property
    def lighthouse_url(self) -> str:
        return f"http://{self.config.host}:{self.config.lighthouse_port}"

    def start(self) -> "PDDeployment":
        """Start every process and wait until each serves; on any failure stop what started and raise."""
        timeout_s = self.config.startup_timeout_s
        # No `with`: on an error or Ctrl-C the pool must not wait for the other workers to become ready.
        pool = ThreadPoolExecutor(1 + len(self.decodes))
        try:
            if self.lighthouse is not None:
                start_lighthouse(self.lighthouse, self.config.lighthouse_port, timeout_s)
            workers = [pool.submit(self._start, "prefill worker", self.prefill, timeout_s)]
            workers += [pool.submit(self._start, self._decode_name(k), decode, timeout_s)
                        for k, decode in enumerate(self.decodes)]
            for worker in workers:
                worker.result()
            self._start("router", self.router, timeout_s)
            self._wait_router_ready(timeout_s)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            self.stop()
            raise
        pool.shutdown()
        return self

    def _decode_name(self, k: int) -> str:
        return "decode worker (harvest serve)" if len(self.decodes) == 1 else f"decode worker {k} (harvest serve)"

    @staticmethod
    def _start(name: str, process: WorkerProcess, timeout_s: float) -> None:
        try:
            process.start(timeout_s)
        except HarvestError as e:
            raise HarvestError(f"{name}: {e}") from None

    def _wait_router_ready(self, timeout_s: float) -> None:
        """The router answers /health before it has found its workers; /readiness is 200 once it sees a
        healthy prefill and decode worker (503 "insufficient healthy workers" until then)."""
        if self.router.wait_until_ok("/readiness", timeout_s, "router"):
            return
        decode = ", ".join(d.url for d in self.decodes)
        raise HarvestError(f"router: no healthy prefill and decode worker reachable after {timeout_s:.0f} s "
                           f"(prefill {self.prefill.url}, decode {decode}); log: {self.router.log_path}")

    def check(self) -> list[str]:
        """One line per process that exited since the last check. Not fatal: the prefill worker's loss, a
        decode worker's while another lives (the router drops it; it is not restarted), the lighthouse's."""
        problems = []
        if self.prefill_exit_code is None and self.prefill.proc.poll() is not None:
            self.prefill_exit_code = self.prefill.proc.returncode
            problems.append(f"the prefill worker exited with {self.prefill_exit_code} (log: {self.prefill.log_path}): "
                            "new requests fail at the router; the decode worker keeps serving what it holds")
        named = [(self._decode_name(k).removesuffix(" (harvest serve)"), d) for k, d in enumerate(self.decodes)]
        named += [("router", self.router)] + ([("fleet lighthouse", self.lighthouse)] if self.lighthouse else [])
        for name, process in named:
            if name not in self.exited and process.proc.poll() is not None:
                self.exited.add(name)
                problems.append(f"the {name} exited with {process.proc.returncode} (log: {process.log_path})")
        return problems

    def is_fatal(self) -> bool:
        """The router is gone, or every decode worker."""
        def gone(p):
            return p.proc is not None and p.proc.poll() is not None
        return gone(self.router) or all(gone(d) for d in self.decodes)

    def stop(self) -> dict[str, int]:
        """Stop the router, the decode workers (side by side), the prefill worker and the lighthouse in turn;
        their exit codes, by name ("decode", or "decode-K" with several)."""
        codes = {"router": self.router.stop()}
        with ThreadPoolExecutor(len(self.decodes)) as pool:
            decode_codes = list(pool.map(lambda d: d.stop(), self.decodes))
        if len(self.decodes) == 1:
            codes["decode"] = decode_codes[0]
        else:
            codes.update({f"decode-{k}": code for k, code in enumerate(decode_codes)})
        codes["prefill"] = self.prefill.stop()
        if self.lighthouse is not None:
            codes["lighthouse"] = self.lighthouse.stop()
        return codes

    def __enter__(self) -> "PDDeployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until_stopped(deployment: PDDeployment, is_stopping, on_problem, poll_s: float = 1.0) -> bool:
    """Watch the deployment until `is_stopping()` or a fatal exit; True if it ended by request."""
    while not is_stopping():
        for problem in deployment.check():
            on_problem(problem)
        if deployment.is_fatal():
            return False
        time.sleep(poll_s)
    return True


def prepare_deployment(config):
    """Check the ports, resolve the model, and give the processes the driver stub (CPU hosts) and the
    transfer engine's system libraries; the deployment is returned unstarted."""
    from base.cuda_driver import ensure_driver_or_stub  # deferred: test_gpu_twin's H100 stand-in patches it

    for flag, port in config.ports().items():
        check_port_free("127.0.0.1" if flag.startswith("--admin-port") else config.host, port, flag)
    config = dataclasses.replace(config, model_path=str(resolve_model_path(config.model_path)))
    if importlib.util.find_spec("mooncake") is None:  # the GPU bundle does not carry it
        raise HarvestError("mooncake is not installed: harvest deploy moves the KV with it (pip install "
                           "mooncake-transfer-engine on a GPU host, harvest's `pd` extra on a CPU host)")
    is_cpu_host = ensure_driver_or_stub()
    if is_cpu_host and config.ib_device:
        raise HarvestError("--ib-device on a host without a GPU driver: mooncake moves KV over TCP here")
    config = dataclasses.replace(config, prefill_lora_flags=prefill_lora_flags(config.serve_args, is_cpu_host))
    env = {"LD_LIBRARY_PATH": library_path_with_system_libs(os.environ.get("LD_LIBRARY_PATH", ""))}
    return PDDeployment(config, is_cpu_host, env)

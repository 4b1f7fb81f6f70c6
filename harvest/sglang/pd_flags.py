"""The SGLang and sglang-router command lines of a one-host PD deployment, and their environment.

Measured facts behind the flags (shared/STACK.md, issue 14): mooncake is SGLang's transfer engine; on a
host with no RDMA device it finds 0 HCAs and moves KV over TCP by itself, so a CPU host must not pass
--disaggregation-ib-device (SGLang fails on the missing InfiniBand sysfs path). SGLANG_HOST_IP keeps the
transfer on loopback; MC_MIN_RPC_PORT / MC_MAX_RPC_PORT bound the ports mooncake listens on. The
bootstrap server runs in the prefill worker; the router learns its port from `--prefill URL PORT`.
"""

import sys

from harvest.sglang.launcher import CPU_ENGINE_ENV, host_flags

TRANSFER_BACKEND = "mooncake"
TRANSFER_HOST = "127.0.0.1"
# Each worker's mooncake engine gets its own port range, so two engines on one host never race for a port.
NUM_TRANSFER_PORTS = 100
# The router's default checks a worker every 60 s and drops it after 3 failures: a lost prefill worker costs
# each request ~60 s of retries before a 500. Checking every 10 s finds it in ~30 s; the 20 s timeout keeps a
# worker whose HTTP server is slow on loaded cores from being dropped.
ROUTER_HEALTH_FLAGS = ["--health-check-interval-secs", "10", "--health-failure-threshold", "3",
                       "--health-check-timeout-secs", "20"]


def worker_env(is_cpu_host: bool, first_rpc_port: int) -> dict[str, str]:
    """Environment of a PD worker: loopback transfer, its own mooncake RPC ports, and a /health that only
    says the server is up. SGLang's default /health runs a one-token generation; the router's checks then
    take forwards from the decode worker and, behind a busy prefill, time out (measured > 5 s on 2 cores)."""
    env = {"SGLANG_HOST_IP": TRANSFER_HOST, "MC_MIN_RPC_PORT": str(first_rpc_port),
           "MC_MAX_RPC_PORT": str(first_rpc_port + NUM_TRANSFER_PORTS - 1),
           "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    return {**env, **CPU_ENGINE_ENV} if is_cpu_host else env


def prefill_env(kv_bootstrap_timeout_s: int) -> dict[str, str]:
    """How long the prefill worker holds a request whose decode worker has not taken its KV. SGLang waits 300 s;
    a request in flight on a decode worker that died then holds the router until the client gives up, since the
    router joins both legs of a request. Failed sooner, the router retries it on a live pair or returns the error."""
    return {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(kv_bootstrap_timeout_s)}


def transfer_flags(ib_device: str | None) -> list[str]:
    flags = ["--disaggregation-transfer-backend", TRANSFER_BACKEND]
    return flags + ["--disaggregation-ib-device", ib_device] if ib_device else flags


def prefill_command(model_path: str, host: str, bootstrap_port: int, is_cpu_host: bool,
                    ib_device: str | None, max_total_tokens: int | None, lora_flags: tuple[str, ...] = ()) -> list[str]:
    """A plain SGLang prefill worker (no harvest inside: the prefill side is untouched); --port follows.
    `lora_flags`: the decode worker publishes its adapter, and the prefill worker loads it too (SGLang's
    server with LoRA on, by harvest/sglang/prefill_worker.py where a CPU host needs pinning off)."""
    program = "harvest.sglang.prefill_worker" if lora_flags else "sglang.launch_server"
    argv = [sys.executable, "-m", program, "--model-path", model_path,
            "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap_port),
            *transfer_flags(ib_device), "--host", host]
    if max_total_tokens is not None:
        argv += ["--max-total-tokens", str(max_total_tokens)]
    for flag, values in host_flags(is_cpu_host).items():
        argv += [flag, *values]
    if is_cpu_host:
        # An idle SGLang scheduler busy-polls a core; between prompts the prefill worker would take it from
        # the decode worker and its finetune job. It sleeps in zmq poll instead (woken by a new request).
        argv.append("--sleep-on-idle")
    return [*argv, *lora_flags]


def decode_flags(host: str, ib_device: str | None) -> list[str]:
    """SGLang flags `harvest serve` passes on to its decode worker in a PD deployment; --port follows."""
    return [*transfer_flags(ib_device), "--host", host]


def router_command(host: str, metrics_port: int, prefill_url: str, bootstrap_port: int,
                   decode_urls: list[str], startup_timeout_s: int) -> list[str]:
    """sglang-router in PD mode over every decode worker (its `--decode URL`, once per worker); --port follows."""
    decode = [arg for url in decode_urls for arg in ("--decode", url)]
    return [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--prefill", prefill_url, str(bootstrap_port), *decode,
            "--host", host, "--prometheus-host", host, "--prometheus-port", str(metrics_port),
            "--worker-startup-timeout-secs", str(startup_timeout_s), "--log-level", "warn",
            *ROUTER_HEALTH_FLAGS]

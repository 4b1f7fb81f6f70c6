"""`harvest serve`: an SGLang decode worker with harvest inside. Unrecognised flags go to SGLang."""

import argparse

from harvest.config import AdminConfig, ServeConfig


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run an SGLang decode worker with harvest inside",
        description="Run an SGLang decode worker (--disaggregation-mode decode) with harvest in its scheduler "
        "process. Every flag not listed here is SGLang's (see `python -m sglang.launch_server --help`). "
        "On a host without a GPU, harvest adds --device cpu --attention-backend torch_native "
        "--disable-cuda-graph --disaggregation-transfer-backend fake unless given.",
        allow_abbrev=False,
    )
    parser.add_argument("--model-path", "--model", default=None,
                        help="local HF model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--admin-host", default="127.0.0.1", help="admin HTTP address (default 127.0.0.1)")
    parser.add_argument("--admin-port", type=int, default=30100, help="admin HTTP port (default 30100)")
    parser.add_argument("--admin-token", default=None,
                        help="bearer token for mutating admin endpoints; required off loopback")
    parser.set_defaults(func=run, accepts_passthrough=True)


def run(args: argparse.Namespace) -> int:
    from harvest.models import resolve_model_path
    from harvest.native.cuda_driver import ensure_driver_or_stub
    from harvest.worker_launcher import build_sglang_argv, check_port_free, flag_value, parse_sglang_args, port_flag
    from harvest.worker_supervisor import supervise

    config = ServeConfig(admin=AdminConfig(host=args.admin_host, port=args.admin_port, token=args.admin_token))
    model_path = resolve_model_path(args.model_path)
    # Ports first: the cheapest check, before SGLang is imported (SGLang's defaults: 127.0.0.1:30000).
    check_port_free(flag_value(args.passthrough, "--host") or "127.0.0.1",
                    port_flag(args.passthrough, "--port", 30000), "--port")
    check_port_free(config.admin.host, config.admin.port, "--admin-port")
    is_cpu_host = ensure_driver_or_stub()
    server_args = parse_sglang_args(build_sglang_argv(str(model_path), args.passthrough, is_cpu_host))
    return supervise(server_args, config, is_cpu_host)

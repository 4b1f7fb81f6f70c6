"""`harvest serve`: run an SGLang decode worker (--disaggregation-mode decode) with harvest in its scheduler
process. Every flag not listed here is SGLang's (see `python -m sglang.launch_server --help`). Unless given,
harvest adds --disaggregation-transfer-backend fake (a lone worker); on a GPU --attention-backend triton; with
--finetune --disable-overlap-schedule; on a host without a GPU --device cpu --attention-backend torch_native
--disable-cuda-graph --disable-overlap-schedule.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import os
import sys

from base.argv import flag_value, port_flag
from base.errors import HarvestError
from base.ports import check_port_free
from base.system_libs import library_path_with_system_libs
from harvest.cli.model_flag import add_worker_parser
from harvest.config import AdminConfig, Colocation, ServeConfig, colocation_mode

JOB_FLAGS = {
    "max_unit_ms": ("--finetune-max-unit-ms", {
        "type": float, "help": "split micro-batches so one unit stays under this (default: the profile's shortest "
        "decode step, so a pause takes effect within one step; without --profile a quarter of the target, and on a "
        "partition held across steps the target less decode's recent step times, up to half of it; set, it holds "
        "for every unit)"}),
    "num_window_layers": ("--finetune-window-layers", {
        "type": int, "help": "frozen-weight layers resident at once (default: all)"}),
    "compile_layers": ("--finetune-compile", {
        "action": argparse.BooleanOptionalAction, "default": True, "help": "on a CPU host, run the jobs' decoder "
        "layers through torch.compile, graphs made while each job is built (about a minute); "
        "--no-finetune-compile: eagerly, as LlamaFactory"}),
    "resume": ("--finetune-resume", {
        "action": "store_true", "help": "continue the job from its last checkpoint in output_dir"}),
}
"""The FinetuneConfig fields `harvest serve` sets by flag (dest: the field): each flag is named once, for the
parser, the config and the errors that name the flag a bad value came from."""


def add_parser(subparsers) -> None:
    parser = add_worker_parser(subparsers, "serve", run, help="run an SGLang decode worker with harvest inside",
                               description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-host", default="127.0.0.1", help="admin HTTP address (default 127.0.0.1)")
    parser.add_argument("--admin-port", type=int, default=30100, help="admin HTTP port (default 30100)")
    parser.add_argument("--admin-token", default=None,
                        help="bearer token for mutating admin endpoints; required off loopback")
    colocation = parser.add_argument_group("co-located finetuning")
    colocation.add_argument("--finetune", metavar="CFG.yaml", default=None,
                            help="LlamaFactory training YAML (stage sft, finetuning_type lora) to run in the worker")
    colocation.add_argument("--tpot-slo-ms", type=float, default=None,
                            help="decode latency target per step; finetuning never takes time a step needs")
    colocation.add_argument("--profile", default=None,
                            help="latency profile JSON (harvest profile); without it the budget comes from measured steps")
    colocation.add_argument("--colocation", choices=[m.value for m in Colocation], default=None,
                            help="temporal: between decode steps on the whole device; spatial: beside decode on a "
                            "partition, or without --profile the split chosen live; off: serve only (default: spatial "
                            "with --pin-partition or a co-run --profile, or without --profile on a GPU or a CPU host "
                            "of two cores or more; else temporal; off without --finetune)")
    colocation.add_argument("--pin-partition", metavar="INFER,FT", default=None,
                            help="spatial co-location on this one partition every step, no planner: decode on INFER "
                            "SMs (CPU: cores), finetune beside it on FT (profiling, benchmarks). A --profile with "
                            "co-run partitions makes the worker spatial by itself, the planner choosing per step")
    colocation.add_argument("--partition-graph-sets", type=int, default=None,
                            help="spatial on a GPU: decode partitions given a CUDA graph set of their own besides "
                            "the whole device's (default 4 with --profile, else the pinned one's or the even "
                            "split's; each costs graph memory and capture time)")
    colocation.add_argument("--partition-graph-max-bs", type=int, default=None,
                            help="largest batch captured on a partition's graph set (default: the largest the "
                            "--profile's planner co-runs at); a larger batch on a partition decodes eagerly on its SMs")
    colocation.add_argument("--allow-synthetic-profile", action="store_true",
                            help="run on a SYNTHETIC --profile (made-up numbers, e.g. the shipped H100 one); "
                            "refused without this flag")
    for field, (flag, options) in JOB_FLAGS.items():
        colocation.add_argument(flag, dest=field, **options)
    fleet = parser.add_argument_group("a fleet training one adapter (torchft)")
    fleet.add_argument("--fleet", metavar="LIGHTHOUSE_URL", default=None,
                       help="train the --finetune job with the other workers of this torchft lighthouse: every round "
                       "their adapters' changes are averaged, weighted by tokens trained, and each serves the result")
    fleet.add_argument("--replica-id", default=None, help="this worker's name in the fleet (unique among live members)")
    fleet.add_argument("--fleet-shard", metavar="K/N", default=None,
                       help="train shard K of N of the job's dataset (each member its own)")
    fleet.add_argument("--fleet-round-tokens", type=int, default=None,
                       help="start a round after this many tokens trained (default: every 60 s)")
    fleet.add_argument("--fleet-round-s", type=float, default=None, help="start a round after this many seconds")
    fleet.add_argument("--fleet-min-members", type=int, default=1, help="members a round waits for (default 1)")
    fleet.add_argument("--fleet-checkpoint-dir", default=None,
                       help="where the fleet's adapter is written after each round and a fleet restarted whole "
                       "resumes from (default: the job's output_dir/fleet-rounds; share it between the members)")
    colocation.add_argument("--job-quantum-s", type=float, default=30.0,
                            help="unit seconds a job trains before another of the same deadline standing and "
                            "priority takes its turn (default 30; each switch re-fetches the incoming job's window)")
    colocation.add_argument("--jobs-dir", default=None,
                            help="keep the worker's job set (specs, states, checkpoints' places) in this directory, "
                            "so a restarted worker resumes it (default: not kept across restarts). A worker with "
                            "--tpot-slo-ms takes jobs through its admin API (`harvest jobs`), --finetune or not")
    colocation.add_argument("--publish-to", metavar="URL", action="append", default=[],
                            help="another SGLang worker that loads every version the job publishes (repeatable; "
                            "`harvest deploy` passes its prefill worker's)")
    colocation.add_argument("--no-kv-lending", action="store_true",
                            help="keep the job's weight window out of the KV cache (default: free KV chunks are lent)")
    colocation.add_argument("--kv-block-kib", type=int, default=2048,
                            help="KV pool mapping granularity in KiB (default 2048, CUDA's; a CPU host takes 4 and up)")


def run(args: argparse.Namespace) -> int:
    from base.cuda_driver import ensure_driver_or_stub  # deferred: test_gpu_twin's H100 stand-in patches it
    from harvest.models import resolve_model_path
    from harvest.sglang.launcher import build_sglang_argv, launch, parse_sglang_args
    from harvest.worker.supervisor import supervise  # deferred: test_gpu_twin patches it

    model_path = resolve_model_path(args.model_path)
    finetune, llamafactory = _finetune_config(args, model_path)
    config = ServeConfig(
        admin=AdminConfig(host=args.admin_host, port=args.admin_port, token=args.admin_token),
        finetune=finetune,
        jobs_dir=args.jobs_dir,
        fleet=_fleet_config(args),
        job_quantum_s=args.job_quantum_s,
        tpot_slo_ms=args.tpot_slo_ms,
        profile_path=args.profile,
        kv_lending=not args.no_kv_lending,
        kv_block_kib=args.kv_block_kib,
        pinned_partition=_partition_flag(args.pin_partition),
        colocation=None if args.colocation is None else Colocation(args.colocation),
        partition_graph_sets=args.partition_graph_sets,
        partition_graph_max_bs=args.partition_graph_max_bs,
        publish_to=tuple(args.publish_to),
    )
    if config.profile_path is not None:
        _check_profile(config, args.allow_synthetic_profile)
    _check_core_partitions(config)
    if config.fleet is not None:
        from harvest.fleet.lighthouse import check_lighthouse

        check_lighthouse(config.fleet.lighthouse, config.fleet.replica_id)
    # Ports first: the cheapest check, before SGLang is imported (SGLang's defaults: 127.0.0.1:30000).
    check_port_free(flag_value(args.passthrough, "--host") or "127.0.0.1",
                    port_flag(args.passthrough, "--port", 30000), "--port")
    check_port_free(config.admin.host, config.admin.port, "--admin-port")
    is_cpu_host = ensure_driver_or_stub()
    # SGLang's scheduler process loads the PD transfer engine, which links libibverbs (build/syslibs).
    os.environ["LD_LIBRARY_PATH"] = library_path_with_system_libs(os.environ.get("LD_LIBRARY_PATH", ""))
    passthrough = args.passthrough
    if llamafactory is not None and llamafactory.publishing is not None:
        from harvest.sglang.lora_flags import lora_flags_for

        passthrough = [*passthrough, *lora_flags_for(llamafactory, passthrough, is_cpu_host)]
    server_args = parse_sglang_args(build_sglang_argv(str(model_path), passthrough, is_cpu_host,
                                                      has_job=config.finetune is not None))
    return supervise(launch, server_args, config, is_cpu_host)


def _finetune_config(args: argparse.Namespace, model_path):
    """(the worker's FinetuneConfig, the --finetune job's LlamaFactoryArgs or None); (None, None) for a worker
    that serves only (no --tpot-slo-ms, or --colocation off). The --finetune job is checked whole up front
    (harvest's job check; no model or data loaded): a bad job is an error here, not a failed job inside a worker
    that took a minute to start."""
    from base.cuda_driver import has_real_driver  # deferred: test_gpu_twin's H100 stand-in patches it
    from harvest.finetune import FinetuneConfig
    from harvest.finetune.job_validation import check_job, finetune_config

    if args.finetune is None:
        if args.resume:
            raise HarvestError("--finetune-resume needs --finetune: the job to resume (a job set resumes by "
                               "--jobs-dir)")
        if args.tpot_slo_ms is None or args.colocation == Colocation.OFF.value:
            return None, None  # serve only
    elif args.tpot_slo_ms is None or not args.tpot_slo_ms > 0:
        return FinetuneConfig(yaml_path=args.finetune), None  # ServeConfig names the missing or bad --tpot-slo-ms
    # max_unit_ms None: units fit the profile's shortest step, or a quarter of the target without one (unit_bound_ms).
    flags = {field: flag for field, (flag, _) in JOB_FLAGS.items()}
    config = finetune_config(flags, yaml_path=args.finetune, device="cuda" if has_real_driver() else "cpu",
                             served_model_path=str(model_path), **{field: getattr(args, field) for field in JOB_FLAGS})
    if args.finetune is None:
        return config, None
    llamafactory = check_job(args.finetune, config, resume_flag=flags["resume"])
    return config, llamafactory


def _fleet_config(args: argparse.Namespace):
    """The --fleet flags as a FleetConfig; None without --fleet (and then no other fleet flag may be given)."""
    from harvest.fleet import RoundPolicy
    from harvest.fleet.fleet_config import FleetConfig, parse_shard

    if args.fleet is None:
        given = [flag for flag, value in (("--replica-id", args.replica_id), ("--fleet-shard", args.fleet_shard),
                                          ("--fleet-round-tokens", args.fleet_round_tokens),
                                          ("--fleet-round-s", args.fleet_round_s),
                                          ("--fleet-checkpoint-dir", args.fleet_checkpoint_dir)) if value is not None]
        if given:
            raise HarvestError(f"{given[0]} needs --fleet: the lighthouse of the fleet it configures")
        return None
    if args.replica_id is None:
        raise HarvestError("--fleet needs --replica-id: this worker's name in the fleet")
    every_s = args.fleet_round_s if args.fleet_round_s is not None or args.fleet_round_tokens is not None else 60.0
    return FleetConfig(args.fleet, args.replica_id, parse_shard(args.fleet_shard),
                       RoundPolicy(args.fleet_round_tokens, every_s), args.fleet_checkpoint_dir, args.fleet_min_members)


def _check_profile(config: ServeConfig, allow_synthetic: bool) -> None:
    """A bad profile, or one that cannot give the --colocation asked for, fails here, not in the worker; a
    synthetic one only where the user asked for it."""

    from predictor import Profile
    from predictor.synthetic_profile import is_synthetic

    path = config.profile_path
    profile = Profile.load(path)
    if config.finetune is not None:
        colocation_mode(config, profile)
    if not is_synthetic(profile):
        return
    if not allow_synthetic:
        raise HarvestError(f"--profile {path} is SYNTHETIC ({profile.device_name}): measure one with "
                           "`harvest profile`, or pass --allow-synthetic-profile to plan with made-up numbers")
    print(f"harvest serve: warning: --profile {path} is SYNTHETIC ({profile.device_name}); the split "
          "planner's budget is made up, not measured", file=sys.stderr)


def _partition_flag(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        infer, ft = (int(x) for x in value.split(","))
    except ValueError:
        raise HarvestError(f"--pin-partition must be INFER,FT (two whole numbers), got {value!r}") from None
    return infer, ft


def _check_core_partitions(config) -> None:
    """On a CPU host a spatial worker's partitions are core sets: they must fit this host's cores."""
    from base.cuda_driver import has_real_driver  # deferred: test_gpu_twin's H100 stand-in patches it

    if config.finetune is None or has_real_driver():
        return
    from harvest.colocation.core_partitions import CorePartitions
    from predictor import Profile

    pairs = []
    if config.profile_path is not None:
        profile = Profile.load(config.profile_path)
        pairs = [p for p in profile.partitions if p[1] > 0] if profile.is_cpu else []
        if pairs:
            pairs.append((profile.num_sms, 0))
    if config.pinned_partition is not None:
        pairs.append(config.pinned_partition)
    CorePartitions(pairs)

"""SGLang's LoRA flags for a worker that serves the adapter its job trains (`publish_every_steps` or
`publish_name` in the job YAML): set from the job, refused where the user's own flags conflict."""

from base.errors import HarvestError
from base.argv import flag_value, has_flag

# SGLang 0.5.12's LoRA backends that run without CUDA kernels; triton and csgmv need a GPU.
CPU_LORA_BACKEND = "torch_native"


def lora_flags_for(llamafactory, passthrough: list[str], is_cpu_host: bool) -> list[str]:
    """Flags to add to `passthrough` so SGLang can load the job's adapter (its LlamaFactoryArgs) from tensors."""
    rank = llamafactory.finetuning_args.lora_rank
    targets = _lora_targets(llamafactory.finetuning_args.lora_target)
    flags = [] if has_flag(passthrough, "--enable-lora") else ["--enable-lora"]
    given_rank = flag_value(passthrough, "--max-lora-rank")
    if given_rank is None:
        flags += ["--max-lora-rank", str(rank)]
    elif not given_rank.isdigit() or int(given_rank) < rank:
        raise HarvestError(f"--max-lora-rank {given_rank} is below the job's lora_rank {rank}: "
                           "the published adapter would not fit SGLang's LoRA memory pool")
    given_targets = _flag_values(passthrough, "--lora-target-modules")
    if given_targets is None:
        flags += ["--lora-target-modules", *targets]
    elif "all" not in given_targets and ("all" in targets or not set(targets) <= set(given_targets)):
        raise HarvestError(f"--lora-target-modules {' '.join(given_targets)} does not cover the job's lora_target "
                           f"{','.join(targets)}: the published adapter would not load")
    backend = flag_value(passthrough, "--lora-backend")
    if is_cpu_host and backend is None:
        flags += ["--lora-backend", CPU_LORA_BACKEND]
    elif is_cpu_host and backend != CPU_LORA_BACKEND:
        raise HarvestError(f"--lora-backend {backend}: on a host without a GPU only {CPU_LORA_BACKEND} runs")
    return flags


def _lora_targets(lora_target) -> list[str]:
    names = lora_target if isinstance(lora_target, list) else str(lora_target).split(",")
    names = [name.strip() for name in names if name.strip()]
    return ["all"] if "all" in names else names


def _flag_values(argv: list[str], flag: str) -> list[str] | None:
    """The values of a multi-value flag (`--flag a b c`), None if absent."""
    if flag not in argv:
        value = flag_value(argv, flag)
        return None if value is None else [value]
    start = argv.index(flag) + 1
    values = []
    for arg in argv[start:]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values

"""The serve flags that make a deployment's N decode workers one fleet training the job: each joins the
deployment's lighthouse as decode-K on shard K/N and writes its own output_dir (the job's + "-K", through a copy
of the job's YAML in the log folder); all share one round-checkpoint folder, so a fleet restarted whole resumes."""

from pathlib import Path

import yaml

from base.argv import flag_value, has_flag
from base.errors import HarvestError


def is_fleet(serve_args: tuple[str, ...], num_decode_workers: int) -> bool:
    """A fleet needs a job and more than one worker; N workers without a job are a plain PD deployment."""
    return num_decode_workers > 1 and flag_value(list(serve_args), "--finetune") is not None


def check_fleet_flags(serve_args: tuple[str, ...], num_decode_workers: int) -> None:
    if not is_fleet(serve_args, num_decode_workers):
        return
    for flag in ("--fleet", "--replica-id", "--fleet-shard"):
        if has_flag(list(serve_args), flag):
            raise HarvestError(f"{flag} with --decode-workers {num_decode_workers}: harvest deploy runs the fleet's "
                               "lighthouse and names each worker itself")


def worker_serve_args(serve_args: tuple[str, ...], index: int, count: int, lighthouse_url: str,
                      job_dir: Path) -> list[str]:
    """Worker `index`'s flags: the serve args with --finetune pointing at its own YAML copy, plus its fleet flags."""
    args = list(serve_args)
    at = args.index("--finetune") if "--finetune" in args else None
    job_path = Path(flag_value(args, "--finetune"))
    try:
        job = yaml.safe_load(job_path.read_text())
        output_dir = str(job["output_dir"]).rstrip("/")
    except (OSError, yaml.YAMLError, TypeError, KeyError) as e:
        raise HarvestError(f"--finetune {job_path}: cannot give each decode worker its output_dir "
                           f"({type(e).__name__}: {e})") from None
    copy = job_dir / f"job-decode-{index}.yaml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(yaml.safe_dump({**job, "output_dir": f"{output_dir}-{index}"}, sort_keys=False))
    if at is None:  # --finetune=PATH
        args = [f"--finetune={copy}" if a.startswith("--finetune=") else a for a in args]
    else:
        args[at + 1] = str(copy)
    fleet = ["--fleet", lighthouse_url, "--replica-id", f"decode-{index}", "--fleet-shard", f"{index}/{count}"]
    if flag_value(args, "--fleet-checkpoint-dir") is None:
        fleet += ["--fleet-checkpoint-dir", f"{output_dir}/fleet-rounds"]
    return args + fleet

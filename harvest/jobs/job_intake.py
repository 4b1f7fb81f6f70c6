"""Submission: a job is checked whole (the check `harvest finetune` runs), sized, admitted against the
deadlines already held, written to the store, and only then handed to the set; any failure leaves the set and
the store as they were. The admin API and `--finetune` both submit through here."""

from dataclasses import replace
from pathlib import Path

from base.errors import HarvestError
from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.jobs.job_set import JobSet, Member
from harvest.jobs.job_spec import JobConflictError, JobSpec, check_spec
from harvest.jobs.job_store import JobRecord, JobStore

ENDED_STATES = ("finished", "cancelled", "failed")


def job_tokens(llamafactory) -> float:
    """The job's work in tokens at most: steps x samples per step x cutoff_len (padding-free packing would
    train fewer; slack errs early)."""
    args = llamafactory.training_args
    if args.max_steps < 1:
        raise HarvestError("max_steps: a job in a worker's job set needs max_steps >= 1 (it sizes the job's work)")
    samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    return float(args.max_steps * samples_per_step * llamafactory.data_args.cutoff_len)


class JobIntake:
    def __init__(self, job_set: JobSet, store: JobStore, config: FinetuneConfig, job_factory,
                 check_fit=None) -> None:
        """`job_factory(spec, finetune_config)`: the FinetuneJob that runs an admitted spec. `check_fit(spec,
        llamafactory)`: the worker's own checks of a parsed job (memory, the LoRA flags SGLang started with),
        raising HarvestError; None: none."""
        self.job_set = job_set
        self.store = store
        self.config = config
        self.job_factory = job_factory
        self.check_fit = check_fit

    def yaml_path(self, name: str) -> Path:
        return self.store.state_dir / f"{name}.yaml"

    def submit(self, name: str, yaml_text: str, priority: int = 0, deadline_s: float | None = None,
               is_best_effort: bool = False, publish_name: str | None = None,
               deadline_tokens: float | None = None, resume: bool = False) -> JobRecord:
        """Check, size, admit, store and queue a job; `resume`: continue it from the checkpoints in its
        output_dir (`--finetune-resume`)."""
        draft = JobSpec(name, yaml_text, 1.0, priority, deadline_s, is_best_effort, publish_name,
                        self.job_set.clock(), deadline_tokens)  # checks the name first: the store's path uses it
        if name in self.job_set.members or self.store.path(name).exists():
            raise JobConflictError(f"name: a job named {name!r} already exists")
        yaml_path = self.yaml_path(name)
        config = replace(self.config, yaml_path=str(yaml_path), resume=resume)
        try:
            llamafactory = check_spec(draft, yaml_path, config)
            spec = replace(draft, total_tokens=job_tokens(llamafactory),
                           publish_name=draft.publish_name or getattr(llamafactory.publishing, "name", None))
            if self.check_fit is not None:
                self.check_fit(spec, llamafactory)
            if spec.deadline_s is not None and not spec.is_best_effort:
                self.job_set.check_deadlines(spec)
            record = JobRecord(spec, "queued", str(llamafactory.output_dir))
            self.store.add(record)
        except BaseException:
            yaml_path.unlink(missing_ok=True)
            raise
        self.job_set.add(Member(spec, self.job_factory(spec, config)))  # name and deadline checked above
        return record

    def persist(self) -> None:
        """Write each live job's state and tokens (the runtime calls it after a checkpoint or a state change):
        what a restart resumes from."""
        for name, member in list(self.job_set.members.items()):
            record = self.store.get(name)
            state = self.job_set.job_state(member)
            error = getattr(member.job, "error", None)
            if (record.state, record.num_trained_tokens, record.error) != (state, member.num_trained_tokens, error):
                self.store.update(name, state=state, num_trained_tokens=member.num_trained_tokens, error=error)

    def restore(self) -> list[Member]:
        """A restarted worker's set: every stored job not ended, in its stored state (paused stays paused,
        running and queued are queued until the scheduler picks), resumed from its latest checkpoint."""
        restored = []
        for record in self.store.load():
            if record.state in ENDED_STATES or record.spec.name in self.job_set.members:
                continue
            has_checkpoint = record.checkpoint_dir is not None and CheckpointStore(record.checkpoint_dir).latest()
            config = replace(self.config, yaml_path=str(self.yaml_path(record.spec.name)),
                             resume=bool(has_checkpoint))
            member = Member(record.spec, self.job_factory(record.spec, config),
                            num_trained_tokens=record.num_trained_tokens, is_paused=record.state == "paused")
            if member.is_paused and hasattr(member.job, "pause"):
                member.job.pause()
            restored.append(self.job_set.add(member))
        return restored

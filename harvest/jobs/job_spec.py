"""A submitted finetune job: its LlamaFactory YAML and what the scheduler needs to rank it. Checked whole at
submission (the same check `harvest finetune` runs), so nothing bad is queued."""

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from base.errors import HarvestError

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
"""Job names become adapter names, file names and Prometheus label values: keep them to a safe charset."""
ADAPTER_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""An adapter name is what requests give SGLang as lora_path: no spaces or slashes."""
MAX_YAML_BYTES = 64 * 1024


class JobConflictError(HarvestError):
    """A well-formed request the job set cannot take as things stand: a duplicate name, a full set, a verb on a
    job in the wrong state, a deadline the measured rate cannot meet (the admin API answers 409)."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    """Unique in the set; [a-z0-9_-], at most 63 characters, starting with a letter or digit."""
    yaml_text: str
    """The LlamaFactory YAML, as submitted."""
    total_tokens: float
    """The job's work in trained tokens (max_steps x samples per step x cutoff_len at most); slack and
    admission divide it by the measured harvest rate."""
    priority: int = 0
    """Higher runs first among jobs of equal slack."""
    deadline_s: float | None = None
    """Wall time (UNIX seconds) by which total_tokens should be trained; None: no deadline."""
    is_best_effort: bool = False
    """Admit even if the deadline cannot be met at the measured rate (else 409 at submission)."""
    publish_name: str | None = None
    """The adapter name the job publishes under (given, or its YAML's); None: the job does not publish."""
    submitted_s: float = 0.0
    deadline_tokens: float | None = None
    """The tokens owed by deadline_s (a deadline "N tokens by T"); None: the whole job (total_tokens)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise HarvestError(f"name: {self.name!r} must match {NAME_PATTERN.pattern}")
        if self.publish_name is not None and not ADAPTER_NAME_PATTERN.fullmatch(str(self.publish_name)):
            raise HarvestError(f"publish_name: {self.publish_name!r} must match {ADAPTER_NAME_PATTERN.pattern}")
        if len(self.yaml_text.encode()) > MAX_YAML_BYTES:
            raise HarvestError(f"yaml: {len(self.yaml_text.encode())} bytes, more than {MAX_YAML_BYTES}")
        if not self.total_tokens > 0:
            raise HarvestError(f"total_tokens: {self.total_tokens!r} must be > 0")
        if self.deadline_s is not None and self.deadline_s <= self.submitted_s:
            raise HarvestError(f"deadline_s: {self.deadline_s:.0f} is in the past (now {self.submitted_s:.0f})")
        if self.deadline_tokens is not None:
            if self.deadline_s is None:
                raise HarvestError("deadline_tokens: needs a deadline (the time the tokens are owed by)")
            if not self.deadline_tokens > 0:
                raise HarvestError(f"deadline_tokens: {self.deadline_tokens!r} must be > 0")

    @property
    def tokens_due(self) -> float:
        """The tokens owed by the deadline (all of the job's unless it owes only deadline_tokens)."""
        return self.total_tokens if self.deadline_tokens is None else min(self.deadline_tokens, self.total_tokens)

    @property
    def adapter_name(self) -> str | None:
        return self.publish_name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "JobSpec":
        return cls(**raw)

    def parsed_yaml(self) -> dict[str, Any]:
        """The YAML as a mapping; a syntax error or a non-mapping is a HarvestError naming the line."""
        try:
            raw = yaml.safe_load(self.yaml_text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise HarvestError(f"yaml: not valid YAML{where}") from None
        if not isinstance(raw, dict):
            raise HarvestError("yaml: must be a mapping of LlamaFactory keys")
        return raw


def check_spec(spec: JobSpec, yaml_path, config, model_path: str | None = None):
    """The job check `harvest finetune` and `--finetune` run (job_validation.check_job), on the spec's YAML
    written to `yaml_path`; returns the parsed job (LlamaFactoryArgs), raises HarvestError naming the key."""
    from harvest.finetune.job_validation import check_job  # deferred: it loads torch; specs are read without it

    spec.parsed_yaml()  # a syntax error named by its line, before LlamaFactory's parse (which checks the values)
    yaml_path.write_text(spec.yaml_text)
    return check_job(yaml_path, config, model_path=model_path)

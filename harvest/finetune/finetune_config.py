"""One finetune job's configuration: harvest's own knobs, and (for `harvest serve --finetune`) the
LlamaFactory YAML whose training the job runs."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FinetuneConfig:
    device: str = "cpu"
    """Torch device the units run on ("cpu", "cuda", "cuda:1"); frozen weights are kept in host memory."""
    num_window_layers: int | None = None
    """Decoder layers whose frozen weights stay resident on the device; None keeps all of them (no swapping)."""
    max_unit_ms: float | None = None
    """Split micro-batches into row slices so one unit stays under this many ms; None never splits on time."""
    max_slice_rows: int | None = None
    """Hard cap on rows per unit, applied after `max_unit_ms`; None means no cap."""
    resume: bool = False
    """Continue from the newest harvest checkpoint in the job's output_dir."""
    log_name: str = "finetune_log.jsonl"
    """Per-step JSON lines log (loss, tokens/s, window), written inside output_dir."""
    yaml_path: str | None = None
    """The LlamaFactory YAML a co-located job builds its engine from (an engine built directly is given the
    parsed YAML instead)."""
    model_path: str | None = None
    """Overrides the YAML's model_name_or_path (the worker's own model)."""
    data_shard: tuple[int, int] | None = None
    """(K, N): train on shard K of N of the dataset (contiguous, as `datasets.Dataset.shard`), a fleet worker's
    share; None: all of it."""
    warm_up_units: bool = True
    """Run every unit kind once on a tiny batch while the engine is built, changing nothing of its training, so
    the first run's one-time work (kernel loading) is not a unit on the decode path. False: each kind's first
    unit pays it."""
    compile_layers: bool = False
    """On a CPU, run the decoder layers through torch.compile (harvest.finetune.compiled_layers), their graphs
    made in the warm-up (so it needs warm_up_units), which takes about a minute. Losses then equal LlamaFactory's
    within float rounding, not bit for bit. A GPU job runs them eagerly (not measured compiled)."""
    compile_thread_counts: tuple[int, ...] = ()
    """The torch thread counts the job's units run with, a graph set made for each: in a worker, those of its
    core partitions and of decode's thread; empty: the building thread's."""
    served_model_path: str | None = None
    """The model the worker serves (`harvest serve`): the job shares its weights only if it is the same
    model (harvest.finetune.base_weights); None: a job outside a worker."""

    def __post_init__(self) -> None:
        if self.num_window_layers is not None and self.num_window_layers < 1:
            raise ValueError(f"num_window_layers must be >= 1 or None, got {self.num_window_layers}")
        if self.max_unit_ms is not None and self.max_unit_ms <= 0:
            raise ValueError(f"max_unit_ms must be > 0 or None, got {self.max_unit_ms}")
        if self.max_slice_rows is not None and self.max_slice_rows < 1:
            raise ValueError(f"max_slice_rows must be >= 1 or None, got {self.max_slice_rows}")
        if self.data_shard is not None and not 0 <= self.data_shard[0] < self.data_shard[1]:
            raise ValueError(f"data_shard must be (K, N) with 0 <= K < N, got {self.data_shard}")
        if any(count < 1 for count in self.compile_thread_counts):
            raise ValueError(f"compile_thread_counts must be >= 1, got {self.compile_thread_counts}")
        if self.compile_layers and not self.warm_up_units:
            raise ValueError("compile_layers needs warm_up_units, where the graphs are made")
        if not self.log_name or "/" in self.log_name:
            raise ValueError(f"log_name must be a plain file name, got {self.log_name!r}")

"""The allocation pattern the finetune engine really produces in lent memory, recorded from a real run.

Inside a decode worker only the engine's resident frozen weights go through its WeightMemory (the unified
allocator): one tensor per dtype group of a layer, allocated when a layer is fetched into the window and
freed when it is evicted. `RecordingWeightMemory` logs those calls, with the unit boundaries between them,
from a real engine over torch's allocator; `harvest bench allocator` replays the log.

Record again (the embedded SmolLM2-135M on the demo job, a 8-layer window, 2 optimizer steps, ~1 min on CPU):
`python -m harvest.bench.weight_pattern`.

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml

SHIPPED_PATH = Path(__file__).with_name("patterns") / "smollm2-135m-demo-window8.json"
ALLOC, FREE, UNIT_END = "a", "f", "u"


class RecordingWeightMemory:
    """A WeightMemory over torch's allocator that logs [ALLOC, id, bytes], [FREE, id] and [UNIT_END]."""

    def __init__(self, device: torch.device):
        self.device = device
        self.events: list[list] = []
        self._ids: dict[int, int] = {}
        self._next_id = 0

    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        self._ids[tensor.data_ptr()] = tensor_id = self._next_id
        self._next_id += 1
        self.events.append([ALLOC, tensor_id, tensor.nbytes])
        return tensor

    def free_tensor(self, tensor: torch.Tensor) -> None:
        self.events.append([FREE, self._ids.pop(tensor.data_ptr())])

    def end_unit(self) -> None:
        self.events.append([UNIT_END])


def load_pattern(path: str | Path = SHIPPED_PATH) -> dict:
    """{"source": how it was recorded, "events": [...]} as written by `record`."""
    return json.loads(Path(path).read_text())


def record(out: Path = SHIPPED_PATH, num_window_layers: int = 8, num_steps: int = 2) -> dict:


    from harvest.finetune import FinetuneConfig, FinetuneEngine
    from harvest.finetune.demo.make_dataset import DEMO_DIR

    demo = yaml.safe_load((DEMO_DIR / "demo.yaml").read_text())
    memory = RecordingWeightMemory(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        job_path = Path(tmp) / "job.yaml"
        demo.update(dataset_dir=str(DEMO_DIR), output_dir=str(Path(tmp) / "out"), max_steps=num_steps,
                    save_steps=10_000)
        job_path.write_text(yaml.safe_dump(demo))
        engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(num_window_layers=num_window_layers),
                                          weight_memory=memory)
        while not engine.is_finished:
            if not engine.has_ready_work():
                engine.set_window(engine.num_window_layers)
            engine.run_next_unit()
            memory.end_unit()
        engine.set_window(0)
    pattern = {"source": f"FinetuneEngine on harvest/finetune/demo/demo.yaml (embedded SmolLM2-135M), "
                         f"window {num_window_layers} layers, {num_steps} optimizer steps",
               "events": memory.events}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(pattern, separators=(",", ":")) + "\n")
    return pattern


if __name__ == "__main__":
    written = record()
    print(f"wrote {SHIPPED_PATH}: {len(written['events'])} events")

"""SGLang's LoRA serving on a host without a GPU.

SGLang 0.5.12's LoRA layers, backends and adapter loader pin host memory unconditionally
(`pin_memory=True`, e.g. sglang/srt/lora/layers.py:432), and torch refuses that without a CUDA driver
("RuntimeError: Found no NVIDIA driver on your system"). Nothing else in LoRA serving needs a GPU
(`--lora-backend torch_native`), so in a CPU worker's scheduler process pinning is made a no-op.

Deferred imports: torch only when the CPU patch is applied, inside the worker.
"""

import functools

PINNING_FACTORIES = ("tensor", "zeros", "empty", "arange", "ones", "full")


def disable_pinned_memory_without_cuda() -> bool:
    """Make pinning a no-op in this process when torch has no CUDA; True if it did."""
    import torch

    if torch.cuda.is_available():
        return False
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    for name in PINNING_FACTORIES:
        factory = getattr(torch, name)

        def without_pinning(*args, _factory=factory, **kwargs):
            kwargs.pop("pin_memory", None)
            return _factory(*args, **kwargs)

        setattr(torch, name, functools.wraps(factory)(without_pinning))
    return True

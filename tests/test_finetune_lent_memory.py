"""The engine's frozen-weight window in KV-cache chunks lent by the unified allocator (host backend: real
memfd pages remapped), against SGLang's own token allocator subclass: training gives the same losses and
LoRA weights as with torch's allocator, the window waits for memory instead of failing, and shrinking it
hands chunks back to KV."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
from conftest import lora_state_dict

from base.cuda_driver import ensure_driver_or_stub
from harvest.colocation.kv_lender import KvLender
from harvest.finetune import FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job

ensure_driver_or_stub()
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from allocator.config import AllocatorConfig
from allocator.unified_allocator import UnifiedAllocator
from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUM_LAYERS = 4
BLOCK_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def job_path(tmp_path_factory):
    return write_tiny_job(tmp_path_factory.mktemp("lent"), num_layers=NUM_LAYERS, max_steps=3)


def lending_allocator(num_chunks: int) -> tuple[UnifiedAllocator, ChunkTokenToKVPoolAllocator]:
    # fp16 rows of 2 KV heads x 16 dims: a 64 KiB block holds 1024 token slots per layer.
    config = AllocatorConfig(num_layers=2, kv_row_bytes=64, num_chunks=num_chunks, block_bytes=BLOCK_BYTES)
    allocator = UnifiedAllocator(config)
    allocator.chunk_pool.kv_buffers(config.num_slots, (2, 16), torch.float16)
    slots = ChunkTokenToKVPoolAllocator(config.num_slots - 1, torch.float16, "cpu", None, need_sort=True,
                                        slots_per_chunk=config.slots_per_chunk)
    allocator.attach_kv_slots(slots)
    return allocator, slots


def train(engine: FinetuneEngine) -> tuple[list[float], dict]:
    losses = []
    while not engine.is_finished:
        if not engine.has_ready_work():
            engine.set_window(engine.num_window_layers)  # what the co-location side does when memory frees
            assert engine.has_ready_work(), "the window could not fetch the next layer"
        result = engine.run_next_unit()
        if result.is_step_end:
            losses.append(result.loss)
    return losses, lora_state_dict(engine)


def test_window_in_lent_chunks_trains_like_torch_memory(job_path):
    reference_losses, reference_weights = train(FinetuneEngine.from_yaml(job_path))
    allocator, slots = lending_allocator(num_chunks=24)
    try:
        engine = FinetuneEngine.from_yaml(job_path, weight_memory=allocator)
        layer_bytes = engine.window_bytes(1)
        losses, weights = train(engine)
        stats = allocator.stats()
        assert stats["chunks_lent"] * stats["chunk_bytes"] >= NUM_LAYERS * layer_bytes
        assert stats["lent_used_bytes"] >= engine.stats()["resident_bytes"] == NUM_LAYERS * layer_bytes
        assert losses == reference_losses
        for name, tensor in reference_weights.items():
            assert torch.equal(weights[name], tensor), name
        while engine.shrink_window():
            pass
        assert engine.stats()["resident_bytes"] == 0 and not engine.shrink_window()
        returned = allocator.return_idle_chunks()
        assert returned == stats["chunks_lent"] and allocator.stats()["chunks_lent"] == 0
        assert slots.available_size() == slots.size
    finally:
        allocator.close()


def test_window_fits_the_lent_memory_and_shrinks_under_kv_pressure(job_path):
    """Lending is capped by KV demand so only part of the window fits: the engine keeps the soonest-needed
    layers that fit and trains on, and the lender's reclaim (the engine shrinks by one layer a step) gives the
    chunk back when KV needs it."""
    probe = FinetuneEngine.from_yaml(job_path)
    layer_bytes = probe.window_bytes(1)
    del probe
    allocator, slots = lending_allocator(num_chunks=12)
    try:
        chunk_bytes = allocator.config.blocks_per_chunk * BLOCK_BYTES
        assert layer_bytes < chunk_bytes < NUM_LAYERS * layer_bytes, "a chunk must hold part of the window"
        # Everything but one chunk is needed by KV: at most one chunk can be lent.
        allocator.set_kv_demand(slots.available_size() - 2 * allocator.config.slots_per_chunk + 1)
        engine = FinetuneEngine.from_yaml(job_path, weight_memory=allocator)
        lender = KvLender(allocator)
        lender.attach_engine(engine, NUM_LAYERS)
        while engine.num_resident_layers == 0:
            engine.run_next_unit()  # the embedding unit, then the window fills as far as it can
        num_resident = engine.num_resident_layers
        assert 1 <= num_resident < NUM_LAYERS and num_resident * layer_bytes <= chunk_bytes
        assert allocator.stats()["chunks_lent"] == 1
        # The window the memory holds slides along the units (the soonest-needed layers stay resident),
        # so a whole step runs without ever waiting on a layer.
        steps_before = engine.global_step
        while engine.global_step == steps_before:
            assert engine.has_ready_work(), "a unit waited on a layer while later ones sat resident"
            engine.run_next_unit()
            assert engine.num_resident_layers <= num_resident
        num_resident = engine.num_resident_layers
        # Decode needs every slot now: the lender asks the engine to shrink, one layer per step, and the chunk
        # goes back with the last layer in it.
        for num_calls in range(1, num_resident + 1):
            assert lender.rebalance(slots.size, can_grow=False)
            assert engine.num_resident_layers == num_resident - num_calls
            assert allocator.stats()["chunks_lent"] == int(num_calls < num_resident)
        assert lender.num_shrinks == num_resident and engine.num_window_layers == 0
        # Demand gone: the window grows back and training finishes.
        allocator.set_kv_demand(0)
        engine.set_window(NUM_LAYERS)
        train(engine)
        assert engine.is_finished
    finally:
        allocator.close()

"""Unmapping waits for the streams that used a range (defect 4 of issue 11), checked on the host backend with
recording stand-ins for CUDA streams and events (the one fake: no GPU here). The real path is the doctor's
gpu_unmap_inflight_* and gpu_swap_evict checks and test_allocator_cuda.py under -m gpu."""

import contextlib

import torch
from torch import nn

from allocator.config import AllocatorConfig
from allocator.host_backend import HostBackend
from allocator.unified_allocator import UnifiedAllocator
from harvest.finetune.layer_swapper import LayerSwapper

BLOCK = 64 << 10


class Log(list):
    pass


class RecordingStream:
    def __init__(self, name: str, log: Log):
        self.name, self.log = name, log

    def synchronize(self):
        self.log.append(f"sync {self.name}")

    def wait_event(self, event):
        self.log.append(f"{self.name} waits {event.name}")


class RecordingBackend(HostBackend):
    """The real host backend, logging the unmaps (where a CUDA unmap would race the streams)."""

    def __init__(self, log: Log, *args):
        super().__init__(*args)
        self.log = log

    def unmap(self, addr, num_bytes):
        self.log.append("unmap")
        super().unmap(addr, num_bytes)

    def unmap_blocks(self, addrs):
        self.log.append(f"unmap {len(addrs)} blocks")
        super().unmap_blocks(addrs)


def make_allocator(log: Log, num_layers: int = 2, num_chunks: int = 8) -> UnifiedAllocator:
    config = AllocatorConfig(num_layers=num_layers, kv_row_bytes=256, num_chunks=num_chunks, block_bytes=BLOCK)
    return UnifiedAllocator(config, RecordingBackend(log, num_chunks * config.blocks_per_chunk, BLOCK))


def test_free_tensor_waits_for_every_stream_that_used_it_before_unmapping():
    log = Log()
    allocator = make_allocator(log)
    try:
        allocator.chunk_pool.lend(7)
        tensor = allocator.alloc_tensor((BLOCK,), torch.uint8)
        allocator.record_stream(tensor, RecordingStream("copy", log))
        allocator.record_stream(tensor, RecordingStream("compute", log))
        log.clear()
        allocator.free_tensor(tensor)
        assert log == ["sync copy", "sync compute", "unmap"]
    finally:
        allocator.close()


def test_lend_waits_for_the_kv_streams_and_unmaps_a_chunk_in_one_call():
    log = Log()
    allocator = make_allocator(log, num_layers=3)
    try:
        allocator.record_kv_stream(RecordingStream("forward", log))
        log.clear()
        allocator.chunk_pool.lend(5)
        assert log == ["sync forward", "unmap 6 blocks"]     # 2 x 3 layers, one native call
    finally:
        allocator.close()


def test_drain_waits_for_the_users_of_the_tensors_it_moves():
    log = Log()
    allocator = make_allocator(log)
    try:
        pool = allocator.chunk_pool
        pool.lend(7)
        pool.lend(6)
        tensor = pool.alloc_tensor((BLOCK,), torch.uint8)
        tensor.fill_(3)
        pool.record_stream(tensor, RecordingStream("finetune", log))
        chunk_id = pool.ledger.used_blocks_of(6) and 6 or 7
        log.clear()
        assert pool.drain(chunk_id)
        assert log[0] == "sync finetune" and "unmap" in log[1:]
        assert bool((tensor == 3).all())
        pool.free_tensor(tensor)
    finally:
        allocator.close()


class RecordingEvent:
    count = 0

    def __init__(self):
        RecordingEvent.count += 1
        self.name = f"event{RecordingEvent.count}"

    def record(self, stream):
        stream.log.append(f"{stream.name} records {self.name}")

    def query(self):
        return False


def test_evict_right_after_prefetch_waits_for_the_copy_before_unmapping(monkeypatch):
    """Pins defect 4: shrink_window evicts the layer needed last, usually the one being prefetched on the copy
    stream; the lent tensor was unmapped mid-copy (record_stream does nothing for memory that is not torch's)."""
    log = Log()
    allocator = make_allocator(log, num_chunks=16)
    try:
        for chunk_id in range(1, 16):
            allocator.chunk_pool.lend(chunk_id)
        layers = nn.ModuleList([nn.Sequential(nn.Linear(128, 128, bias=False)) for _ in range(2)])
        for param in layers.parameters():
            param.requires_grad_(False)
        swapper = LayerSwapper(layers, torch.device("cpu"), memory=allocator)
        compute = RecordingStream("compute", log)
        swapper._is_cuda = True                       # drive the CUDA branch with the recording stand-ins
        swapper._copy_stream = RecordingStream("copy", log)
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "Event", RecordingEvent)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
        log.clear()
        swapper.fetch(1)
        swapper.evict(1)
        assert log.index("sync copy") < log.index("unmap")
        assert "sync compute" not in log              # the compute stream never used layer 1
        swapper.fetch(0)
        swapper.wait(0)
        log.clear()
        swapper.evict(0)
        assert log == ["sync copy", "sync compute", "unmap"]
    finally:
        allocator.close()


"""Unified allocator over real memory (host memfd/mmap; CUDA cuMem* under the gpu marker), with SGLang's
own token allocator subclass deciding KV slots. Random sequences of KV alloc/free, lend, tensor
alloc/free and reclaim keep every invariant of the issue, checked on real bytes."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from base.cuda_driver import ensure_driver_or_stub

ensure_driver_or_stub()
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from allocator.chunk_ledger import ChunkState
from allocator.chunk_pool import OutOfLentMemory
from allocator.config import AllocatorConfig
from allocator.unified_allocator import UnifiedAllocator
from base.errors import HarvestError
from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator

HEADS, HEAD_DIM = 2, 32


def small_config(backend: str = "host", **fields) -> AllocatorConfig:
    # fp32 rows of 256 bytes; a 16 KiB block holds 64 token slots per layer (host pages are 4 KiB).
    block_bytes = 2 << 20 if backend == "cuda" else 16384
    defaults = {"num_layers": 2, "kv_row_bytes": HEADS * HEAD_DIM * 4, "num_chunks": 8, "block_bytes": block_bytes,
                "backend": backend}
    return AllocatorConfig(**{**defaults, **fields})


def build(config: AllocatorConfig):
    allocator = UnifiedAllocator(config)
    size = config.num_slots - 1
    k_buffer, v_buffer = allocator.chunk_pool.kv_buffers(size + 1, (HEADS, HEAD_DIM), torch.float32)
    token_allocator = ChunkTokenToKVPoolAllocator(size, torch.float32, allocator.backend.device, None,
                                                  need_sort=False, slots_per_chunk=config.slots_per_chunk)
    allocator.attach_kv_slots(token_allocator)
    return allocator, token_allocator, k_buffer, v_buffer


class PoolMachine(RuleBasedStateMachine):
    backend = "host"

    def __init__(self):
        super().__init__()
        self.config = small_config(self.backend)
        self.allocator, self.slots, self.k_buffer, self.v_buffer = build(self.config)
        self.device = self.allocator.backend.device
        self.requests: list[tuple[torch.Tensor, float]] = []
        self.tensors: list[tuple[torch.Tensor, float]] = []
        self.next_value = 1.0

    def _value(self) -> float:
        self.next_value += 1.0
        return self.next_value

    @rule(num_tokens=st.integers(1, 150))
    def kv_alloc(self, num_tokens):
        slots = self.slots.alloc(num_tokens)
        if slots is None:
            return
        chunk_ids = (slots // self.config.slots_per_chunk).tolist()
        assert all(self.allocator.chunk_pool.state(c) is ChunkState.KV for c in chunk_ids), "slot of a lent chunk"
        live = torch.cat([s for s, _ in self.requests]) if self.requests else slots[:0]
        assert not torch.isin(slots, live).any(), "slot handed out twice"
        value = self._value()
        for buffer in self.k_buffer + self.v_buffer:
            buffer[slots.to(self.device)] = value
        self.requests.append((slots, value))

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100))
    def kv_free(self, index):
        slots, _ = self.requests.pop(index % len(self.requests))
        self.slots.free(slots)

    @rule(num_chunks=st.integers(1, 3))
    def lend(self, num_chunks):
        self.allocator.lend_chunks(num_chunks)

    @rule(num_blocks=st.integers(1, 5), tail_bytes=st.integers(0, 4000))
    def tensor_alloc(self, num_blocks, tail_bytes):
        num_bytes = (num_blocks - 1) * self.config.block_bytes + tail_bytes + 4
        try:
            tensor = self.allocator.alloc_tensor((num_bytes // 4,), torch.float32)
        except OutOfLentMemory:
            return
        value = self._value()
        tensor.fill_(value)
        self.tensors.append((tensor, value))

    @rule(num_bytes=st.integers(1, 3 * 16384))
    def shared_block_tensor_alloc(self, num_bytes):
        """Straight to lent blocks at any size: tensors share blocks at byte granularity."""
        try:
            tensor = self.allocator.chunk_pool.alloc_tensor((num_bytes,), torch.uint8)
        except OutOfLentMemory:
            return
        value = self._value() % 251
        tensor.fill_(value)
        self.tensors.append((tensor, value))

    @precondition(lambda self: self.tensors)
    @rule(index=st.integers(0, 100))
    def tensor_free(self, index):
        tensor, _ = self.tensors.pop(index % len(self.tensors))
        self.allocator.free_tensor(tensor)

    @rule(index=st.integers(0, 100))
    def drain(self, index):
        """Migration keeps every tensor's bytes at its address (checked by live_bytes_intact)."""
        lent = self.allocator.chunk_pool.ledger.lent_chunk_ids()
        if lent:
            chunk_id = lent[index % len(lent)]
            if self.allocator.chunk_pool.drain(chunk_id):
                assert self.allocator.chunk_pool.ledger.is_idle(chunk_id)

    @rule(max_chunks=st.integers(1, 3))
    def reclaim(self, max_chunks):
        self.allocator.return_idle_chunks(max_chunks)

    @invariant()
    def live_bytes_intact(self):
        for slots, value in self.requests:
            index = slots.to(self.device)
            for buffer in self.k_buffer + self.v_buffer:
                assert bool((buffer[index] == value).all()), "live KV bytes changed"
        for tensor, value in self.tensors:
            assert bool((tensor == value).all()), "tensor bytes changed: a block is used twice"

    @invariant()
    def lent_slots_out_of_circulation(self):
        free = torch.cat((self.slots.free_pages, self.slots.release_pages)).cpu()
        lent = self.allocator.chunk_pool.ledger.lent_chunk_ids()
        assert set(lent) == self.slots.lent_chunk_ids
        assert not torch.isin(free // self.config.slots_per_chunk, torch.tensor(lent, dtype=torch.int64)).any()
        assert self.slots.available_size() + sum(len(s) for s, _ in self.requests) + self.slots.num_lent_slots \
            == self.slots.size

    def teardown(self):
        try:
            for tensor, _ in self.tensors:
                self.allocator.free_tensor(tensor)
            for slots, _ in self.requests:
                self.slots.free(slots)
            self.allocator.return_idle_chunks()
            assert all(s is ChunkState.KV for s in self.allocator.chunk_pool.ledger.states), "memory did not come home"
            assert self.slots.available_size() == self.slots.size
            assert not self.allocator.chunk_pool._tensors
            assert self.allocator.stats()["chunks_lent"] == 0
        finally:
            self.allocator.close()


PoolMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck))
TestHostPool = PoolMachine.TestCase


class CudaPoolMachine(PoolMachine):
    backend = "cuda"


CudaPoolMachine.TestCase.settings = PoolMachine.TestCase.settings
TestCudaPool = pytest.mark.gpu(CudaPoolMachine.TestCase)


@pytest.fixture
def pool():
    allocator, slots, _, _ = build(small_config())
    yield allocator, slots
    allocator.close()


def test_bad_requests_raise_and_leave_pool_consistent(pool):
    allocator, _ = pool
    allocator.lend_chunks(2)
    before = allocator.stats()
    for shape in [(0,), (-3, 4), (10**12,)]:
        with pytest.raises(HarvestError):
            allocator.alloc_tensor(shape, torch.float32)
    with pytest.raises(HarvestError, match="not a tensor allocated"):
        allocator.free_tensor(torch.zeros(4))
    tensor = allocator.alloc_tensor((5000,), torch.float32)
    allocator.free_tensor(tensor)
    with pytest.raises(HarvestError):
        allocator.free_tensor(tensor)
    assert allocator.stats() == before


def test_alloc_lends_more_chunks_when_needed_and_spans_chunks(pool):
    allocator, _ = pool
    config = allocator.config
    chunk_bytes = config.blocks_per_chunk * config.block_bytes
    tensor = allocator.alloc_tensor((chunk_bytes + 1,), torch.uint8)
    assert allocator.stats()["chunks_lent"] == 2
    tensor[:] = torch.arange(tensor.numel()) % 251  # spans two chunks mapped contiguously
    assert bool((tensor == torch.arange(tensor.numel()) % 251).all())
    allocator.free_tensor(tensor)
    assert allocator.stats()["chunks_lent_idle"] == 2


def test_reserve_formula_limits_lending():
    """Pins HARLI 4.4: reserved = T_release / TPOT * max_batch tokens of KV stay free; lending stops there."""
    config = small_config(release_ms=30.0, tpot_target_ms=20.0, max_batch=100)
    assert config.reserve_slots == 150
    assert config.reserve_bytes == 150 * 2 * config.num_layers * config.kv_row_bytes
    allocator, slots, _, _ = build(config)
    try:
        num_lent = allocator.lend_chunks(config.num_chunks)
        assert slots.available_size() >= config.reserve_slots
        assert slots.available_size() - config.slots_per_chunk < config.reserve_slots
        assert num_lent == (slots.size - config.reserve_slots) // config.slots_per_chunk
    finally:
        allocator.close()


def test_reclaim_says_when_only_the_finetune_side_can_free_memory():
    """Forces KV pressure under the reserve while every lent chunk is busy: maybe_reclaim() returns nothing and
    needs_reclaim() says decode is still short (the lender then asks the job to shrink); once the finetune side
    frees a tensor, the next call hands its chunk back."""
    config = small_config(release_ms=20.0, tpot_target_ms=50.0, max_batch=64)
    allocator, slots, _, _ = build(config)
    try:
        chunk_bytes = config.blocks_per_chunk * config.block_bytes
        window = [allocator.alloc_tensor((chunk_bytes,), torch.uint8) for _ in range(3)]
        held = slots.alloc(slots.available_size() - config.reserve_slots + 5)
        assert held is not None and slots.available_size() < config.reserve_slots
        assert allocator.maybe_reclaim(allow_drain=True) == 0 and allocator.needs_reclaim()
        allocator.free_tensor(window.pop())
        assert allocator.maybe_reclaim() == 1 and not allocator.needs_reclaim()
        assert slots.available_size() >= config.reserve_slots
    finally:
        allocator.close()


def test_reclaim_drains_a_partly_used_chunk_without_asking_finetune():
    """Forces two lent chunks each holding one tensor and a finetune side that cannot shrink: under KV
    pressure maybe_reclaim(allow_drain=True) moves one chunk's blocks into the other (bytes and
    addresses kept) and returns it."""
    config = small_config(release_ms=20.0, tpot_target_ms=50.0, max_batch=64)
    allocator, slots, _, _ = build(config)
    try:
        pool = allocator.chunk_pool
        allocator.lend_chunks(2)
        first = pool.alloc_tensor((config.block_bytes,), torch.uint8)
        filler = pool.alloc_tensor(((config.blocks_per_chunk - 1) * config.block_bytes,), torch.uint8)
        second = pool.alloc_tensor((config.block_bytes // 2,), torch.uint8)
        pool.free_tensor(filler)
        chunks = {b // config.blocks_per_chunk for t in (first, second)
                  for b in pool.ledger.placement_of(pool._tensors[t.data_ptr()][0]).block_ids}
        assert len(chunks) == 2, "the two tensors sit in different chunks"
        first.fill_(11)
        second.fill_(22)
        addresses = (first.data_ptr(), second.data_ptr())
        held = slots.alloc(slots.available_size() - config.reserve_slots + 1)
        assert held is not None
        assert allocator.maybe_reclaim(allow_drain=False) == 0, "without drain, nothing is idle"
        assert allocator.needs_reclaim()
        assert allocator.maybe_reclaim(allow_drain=True) == 1
        assert not allocator.needs_reclaim(), "the drain alone freed a chunk"
        assert slots.available_size() >= config.reserve_slots
        assert (first.data_ptr(), second.data_ptr()) == addresses
        assert bool((first == 11).all()) and bool((second == 22).all())
        assert len(pool.ledger.lent_chunk_ids()) == 1
    finally:
        allocator.close()


def test_new_kv_prefers_low_chunks_so_high_chunks_drain(pool):
    allocator, slots = pool
    first = slots.alloc(200)
    second = slots.alloc(10)
    slots.free(first)
    again = slots.alloc(50)
    assert int(again.max()) < int(second.min()), "freed low slots are reused before higher ones"
    assert slots.lendable_chunk_ids()[0] == allocator.config.num_chunks - 1


def test_stray_kv_access_to_a_lent_chunk_faults_instead_of_reading_finetune_data():
    """Pins the unmap guarantee: reading a lent chunk's KV rows kills the process (SIGSEGV) rather than
    returning the finetune tensor's bytes that now live in its blocks."""
    script = textwrap.dedent("""
        import torch, sys
        from allocator.config import AllocatorConfig
        from allocator.unified_allocator import UnifiedAllocator
        config = AllocatorConfig(num_layers=2, kv_row_bytes=256, num_chunks=4, block_bytes=16384)
        allocator = UnifiedAllocator(config)
        k_buffer, _ = allocator.chunk_pool.kv_buffers(config.num_slots, (2, 32), torch.float32)
        allocator.chunk_pool.lend(3)
        tensor = allocator.chunk_pool.alloc_tensor((4 * 16384,), torch.uint8)
        tensor.fill_(7)
        print("lent", flush=True)
        print(float(k_buffer[0][3 * config.slots_per_chunk].sum()), flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.strip() == "lent"
    assert result.returncode == -11


def test_stats_add_up_and_reach_prometheus(pool):
    from prometheus_client import CollectorRegistry, generate_latest

    from allocator.allocator_metrics import AllocatorMetrics
    allocator, _ = pool
    assert allocator.lend_chunks(2) == 2
    tensor = allocator.alloc_tensor((allocator.config.block_bytes + 100,), torch.uint8)
    stats = allocator.stats()
    assert stats["chunks_total"] == stats["chunks_kv"] + stats["chunks_lent"]
    assert stats["lent_bytes"] == stats["lent_used_bytes"] + stats["lent_free_bytes"]
    assert stats["fragmentation_bytes"] == stats["lent_used_bytes"] - tensor.numel()
    registry = CollectorRegistry()
    metrics = AllocatorMetrics(registry)
    metrics.update(stats)
    text = generate_latest(registry).decode()
    assert 'harvest_allocator_chunks{state="lent"} 2.0' in text
    assert f"harvest_allocator_fragmentation_bytes {float(stats['fragmentation_bytes'])}" in text
    allocator.free_tensor(tensor)


def test_syscall_failures_surface_as_errors_naming_the_call():
    from allocator.host_backend import HostBackend
    from allocator.native_vmm import VmmError
    backend = HostBackend(num_blocks=2, block_bytes=16384)
    try:
        addr = backend.reserve(2 * 16384)
        with pytest.raises(VmmError, match=r"hv_unmap failed: EINVAL"):
            backend.unmap(addr + 1, 16384)  # not page aligned
        backend.release(addr, 2 * 16384)
    finally:
        backend.close()
    with pytest.raises(HarvestError, match="multiple of the page size"):
        HostBackend(num_blocks=2, block_bytes=1000)


@pytest.mark.parametrize("fields", [{"num_layers": 0}, {"kv_row_bytes": 3000}, {"backend": "tpu"},
                                    {"tpot_target_ms": 0.0}])
def test_config_rejects_bad_values_with_a_message(fields):
    with pytest.raises(HarvestError):
        small_config(**fields)


def test_a_reclaimed_chunk_comes_back_zeroed():
    """Pins zero-on-reclaim: a chunk lent, filled with finetune bytes and returned reads as zeros through
    every K and V buffer, while KV rows of other chunks keep their bytes."""
    config = small_config()
    allocator, slots, k_buffer, v_buffer = build(config)
    try:
        live = slots.alloc(10)
        for buffer in k_buffer + v_buffer:
            buffer[live] = 3.0
        chunk_id = allocator.kv_slots.lendable_chunk_ids()[0]
        allocator.lend_chunks(1)
        tensor = allocator.alloc_tensor((config.blocks_per_chunk * config.block_bytes,), torch.uint8)
        tensor.fill_(0xAB)
        allocator.free_tensor(tensor)
        assert allocator.return_idle_chunks() == 1
        rows = slice(chunk_id * config.slots_per_chunk, (chunk_id + 1) * config.slots_per_chunk)
        for buffer in k_buffer + v_buffer:
            assert bool((buffer[rows] == 0).all())
            assert bool((buffer[live] == 3.0).all())
    finally:
        allocator.close()


def test_small_allocations_share_lent_blocks():
    """An allocation under one block takes bytes of a lent block, next to others, each keeping its values."""
    allocator, _, _, _ = build(small_config())
    try:
        tensors = [allocator.alloc_tensor((1000,), torch.float32) for _ in range(5)]
        for i, tensor in enumerate(tensors):
            tensor.fill_(i)
        stats = allocator.stats()
        # Five 4000-byte tensors in two 16 KiB blocks, not one block each.
        assert stats["chunks_lent"] == 1 and stats["lent_used_bytes"] == 2 * 16384
        assert [int(t[0]) for t in tensors] == [0, 1, 2, 3, 4] and [int(t[-1]) for t in tensors] == [0, 1, 2, 3, 4]
        for tensor in tensors:
            allocator.free_tensor(tensor)
        assert allocator.stats()["lent_used_bytes"] == 0
    finally:
        allocator.close()


def test_kv_demand_raises_the_floor_for_lending_and_reclaim():
    """Requests waiting for KV count on top of the reserve: lending stops above reserve + demand, and a
    demand that grows after lending makes maybe_reclaim hand chunks back."""
    config = small_config(release_ms=20.0, tpot_target_ms=50.0, max_batch=64)
    allocator, slots, _, _ = build(config)
    try:
        allocator.set_kv_demand(3 * config.slots_per_chunk)
        allocator.lend_chunks(config.num_chunks)
        assert slots.available_size() >= allocator.kv_floor_slots == config.reserve_slots + 3 * config.slots_per_chunk
        num_lent = allocator.stats()["chunks_lent"]
        allocator.set_kv_demand(5 * config.slots_per_chunk)
        assert allocator.maybe_reclaim() >= 1
        assert slots.available_size() >= allocator.kv_floor_slots
        assert allocator.stats()["chunks_lent"] < num_lent
        with pytest.raises(HarvestError, match="KV demand"):
            allocator.set_kv_demand(-1)
    finally:
        allocator.close()

"""The SGLang-facing adapters built against SGLang 0.5.12's own classes, in-process on CPU:
MHATokenToKVPool over chunk-backed buffers and the chunk-aware TokenToKVPoolAllocator."""

import os
import threading

import pytest
import torch

from base.cuda_driver import ensure_driver_or_stub

ensure_driver_or_stub()
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from allocator.chunk_pool import OutOfLentMemory
from allocator.config import AllocatorConfig
from allocator.unified_allocator import UnifiedAllocator
from base.errors import HarvestError
from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator
from harvest.sglang.chunked_kv_pool import ChunkedMHATokenToKVPool, adopt_chunk_buffers

LAYERS, HEADS, HEAD_DIM, SIZE = 3, 2, 32, 700


def pool_kwargs():
    return {"size": SIZE, "page_size": 1, "dtype": torch.float32, "head_num": HEADS, "head_dim": HEAD_DIM,
            "layer_num": LAYERS, "device": "cpu", "enable_memory_saver": False}


@pytest.fixture
def allocator():
    config = AllocatorConfig.for_kv_pool(LAYERS, HEADS, HEAD_DIM, 4, SIZE, granularity_bytes=16384)
    unified = UnifiedAllocator(config)
    yield unified
    unified.close()


def write_and_read(kv_pool, loc, k, v):
    for layer_id in range(LAYERS):
        kv_pool.set_kv_buffer(None, loc, k + layer_id, v - layer_id, layer_id_override=layer_id)
    return [(kv_pool.get_key_buffer(i)[loc].clone(), kv_pool.get_value_buffer(i)[loc].clone()) for i in range(LAYERS)]


def test_chunked_kv_pool_reads_and_writes_like_sglangs_own_pool(allocator):
    chunked = ChunkedMHATokenToKVPool(**pool_kwargs(), chunk_pool=allocator.chunk_pool)
    plain = MHATokenToKVPool(**pool_kwargs())
    assert [b.shape for b in chunked.k_buffer] == [b.shape for b in plain.k_buffer]
    assert chunked.get_kv_size_bytes() == plain.get_kv_size_bytes()
    assert torch.equal(chunked.data_strides, plain.data_strides)
    loc = torch.randperm(SIZE)[:300] + 1
    k, v = torch.randn(300, HEADS, HEAD_DIM), torch.randn(300, HEADS, HEAD_DIM)
    got, want = write_and_read(chunked, loc, k, v), write_and_read(plain, loc, k, v)
    for (gk, gv), (wk, wv) in zip(got, want):
        assert torch.equal(gk, wk) and torch.equal(gv, wv)
    # The bytes live in the chunks: layer 1's K rows are at chunk_pool's buffer 2 (K of layer 1).
    raw = allocator.chunk_pool.kv_buffer(1, is_value=False).view(torch.float32).view(-1, HEADS, HEAD_DIM)
    assert torch.equal(raw[loc], k + 1)
    assert chunked.k_data_ptrs.tolist() == [b.data_ptr() for b in chunked.k_buffer]


def test_adopt_replaces_buffers_of_a_pool_sglang_already_built(allocator):
    kv_pool = MHATokenToKVPool(**pool_kwargs())
    adopt_chunk_buffers(kv_pool, allocator.chunk_pool)
    assert kv_pool.data_ptrs.tolist() == [b.data_ptr() for b in kv_pool.k_buffer + kv_pool.v_buffer]
    assert kv_pool.k_buffer[0].data_ptr() == allocator.chunk_pool.kv_buffer(0, False).data_ptr()
    loc = torch.arange(1, 50)
    write_and_read(kv_pool, loc, torch.ones(49, HEADS, HEAD_DIM), torch.zeros(49, HEADS, HEAD_DIM))
    raw = allocator.chunk_pool.kv_buffer(2, is_value=False).view(torch.float32).view(-1, HEADS, HEAD_DIM)
    assert bool((raw[loc] == 3).all())


def test_adopt_rejects_a_pool_of_another_shape(allocator):
    kwargs = {**pool_kwargs(), "layer_num": LAYERS + 1}
    with pytest.raises(HarvestError, match="does not match"):
        ChunkedMHATokenToKVPool(**kwargs, chunk_pool=allocator.chunk_pool)


def test_token_allocator_matches_sglang_capacity_and_hands_out_lowest_slots(allocator):
    """Without lending, the chunk-aware allocator refuses exactly what SGLang's own allocator refuses and
    has the same available_size over a random alloc/free sequence; each alloc takes the lowest free slots."""
    slots_per_chunk = allocator.config.slots_per_chunk
    ours = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cpu", None, False, slots_per_chunk)
    theirs = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", None, need_sort=False)
    free = set(range(1, SIZE + 1))
    generator = torch.Generator().manual_seed(0)
    live = []
    for _ in range(200):
        if live and torch.rand(1, generator=generator).item() < 0.4:
            a, b = live.pop(int(torch.randint(len(live), (1,), generator=generator)))
            ours.free(a)
            theirs.free(b)
            free |= set(a.tolist())
            continue
        need = int(torch.randint(1, 90, (1,), generator=generator))
        a, b = ours.alloc(need), theirs.alloc(need)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.tolist() == sorted(free)[:need]
            free -= set(a.tolist())
            live.append((a, b))
        assert ours.available_size() == theirs.available_size() == len(free)


def test_free_group_and_backup_restore_keep_sglang_semantics(allocator):
    tokens = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cpu", None, False, allocator.config.slots_per_chunk)
    state = tokens.backup_state()
    taken = tokens.alloc(100)
    tokens.restore_state(state)
    assert tokens.available_size() == SIZE
    taken = tokens.alloc(100)
    tokens.free_group_begin()
    tokens.free(taken[:50])
    tokens.free(taken[50:])
    assert tokens.available_size() == SIZE - 100
    tokens.free_group_end()
    assert tokens.available_size() == SIZE
    assert torch.equal(tokens.alloc(5), torch.arange(1, 6))


def test_lent_chunk_slots_leave_and_return_to_free_pages(allocator):
    tokens = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cpu", None, False, allocator.config.slots_per_chunk)
    allocator.attach_kv_slots(tokens)
    top = tokens.num_chunks - 1
    assert allocator.lend_chunks(1) == 1 and tokens.lent_chunk_ids == {top}
    lent_slots = tokens.chunk_slots(top)
    assert tokens.available_size() == SIZE - len(lent_slots)
    everything = tokens.alloc(tokens.available_size())
    assert not torch.isin(everything, lent_slots).any()
    assert tokens.alloc(1) is None
    tokens.clear()
    assert tokens.available_size() == SIZE - len(lent_slots), "clear keeps lent slots out"
    with pytest.raises(HarvestError):
        tokens.withdraw_chunk(top)
    allocator.return_idle_chunks()
    assert tokens.available_size() == SIZE and tokens.lent_chunk_ids == set()
    assert torch.equal(tokens.free_pages, torch.arange(1, SIZE + 1))


def test_a_chunk_a_pd_transfer_lands_in_is_never_lent(allocator):
    """The decode scheduler allocates a transfer's slots before the KV arrives (SGLang's prealloc queue);
    the chunk holding them stays KV while every all-free chunk is lent, and the landed KV reads back."""
    kv_pool = ChunkedMHATokenToKVPool(**pool_kwargs(), chunk_pool=allocator.chunk_pool)
    tokens = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cpu", kv_pool, False,
                                         allocator.config.slots_per_chunk)
    allocator.attach_kv_slots(tokens)
    top = tokens.num_chunks - 1
    everything = tokens.alloc(SIZE)
    landing = tokens.chunk_slots(top)[:5]
    tokens.free(everything[~torch.isin(everything, landing)])
    allocator.lend_chunks(tokens.num_chunks)
    assert tokens.lent_chunk_ids and top not in tokens.lent_chunk_ids
    k, v = torch.randn(len(landing), HEADS, HEAD_DIM), torch.randn(len(landing), HEADS, HEAD_DIM)
    for (got_k, got_v), layer_id in zip(write_and_read(kv_pool, landing, k, v), range(LAYERS)):
        assert torch.equal(got_k, k + layer_id) and torch.equal(got_v, v - layer_id)


def _on_unit_thread(fn):
    """fn's exception (or None) when it runs on another thread, as a co-run unit's would."""
    raised = []

    def run():
        try:
            fn()
            raised.append(None)
        except Exception as e:  # noqa: BLE001 - the exception is what the test reads
            raised.append(e)

    thread = threading.Thread(target=run, name="harvest-finetune-units")
    thread.start()
    thread.join()
    return raised[0]


def test_kv_chunks_move_only_on_the_thread_that_owns_the_pool(allocator):
    """Pins defect 6: a co-run unit's window change reached lend_chunks -> withdraw_chunk on the unit thread
    while the scheduler thread freed slots (lost frees, a slot used twice); "only the scheduler thread touches
    KV slots" was a comment. Forced by calling each from another thread: a one-line error, nothing moved; a
    window allocation there gets OutOfLentMemory (the unit waits; the scheduler lends at its rebalance)."""
    tokens = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cpu", None, False, allocator.config.slots_per_chunk)
    allocator.attach_kv_slots(tokens)
    top = tokens.num_chunks - 1
    assert allocator.lend_chunks(1) == 1
    for call in (lambda: tokens.withdraw_chunk(top - 1), lambda: tokens.restore_chunk(top),
                 lambda: allocator.lend_chunks(1), allocator.return_idle_chunks):
        error = _on_unit_thread(call)
        assert isinstance(error, HarvestError) and "harvest-finetune-units" in str(error), error
        assert "scheduler thread" in str(error)
    chunk_bytes = allocator.config.blocks_per_chunk * allocator.config.block_bytes
    assert isinstance(_on_unit_thread(lambda: allocator.alloc_tensor((2 * chunk_bytes,), torch.uint8)),
                      OutOfLentMemory)
    assert _on_unit_thread(lambda: allocator.free_tensor(allocator.chunk_pool.alloc_tensor((64,), torch.uint8))) is None
    assert tokens.lent_chunk_ids == {top} and tokens.available_size() == SIZE - tokens.num_chunk_slots(top)
    assert allocator.return_idle_chunks() == 1 and tokens.lent_chunk_ids == set()


def test_decode_attention_over_lent_and_reclaimed_chunks_matches_a_plain_pool():
    """Greedy-decode stand-in at the attention level: the same requests decode step by step through
    SGLang's torch-native SDPA decode over (a) SGLang's own pool and allocator and (b) the chunked pool
    and chunk-aware allocator while chunks are lent, filled with finetune bytes, drained and reclaimed
    (maybe_reclaim keeps the reserve before each step). Every step's attention output must be bitwise equal."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    max_reqs, max_len = 5, 100
    config = AllocatorConfig.for_kv_pool(LAYERS, HEADS, HEAD_DIM, 4, SIZE, granularity_bytes=16384,
                                         release_ms=100.0, tpot_target_ms=20.0, max_batch=max_reqs * max_len // 5)
    assert config.reserve_slots == max_reqs * max_len
    allocator = UnifiedAllocator(config)
    plain_pool = MHATokenToKVPool(**pool_kwargs())
    plain_tokens = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", plain_pool, need_sort=True)
    chunked_pool = ChunkedMHATokenToKVPool(**pool_kwargs(), chunk_pool=allocator.chunk_pool)
    chunk_tokens = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cpu", chunked_pool, True, config.slots_per_chunk)
    allocator.attach_kv_slots(chunk_tokens)
    sides = [(plain_pool, plain_tokens), (chunked_pool, chunk_tokens)]
    req_to_token = [torch.zeros(max_reqs, max_len, dtype=torch.int64) for _ in sides]
    generator = torch.Generator().manual_seed(1)
    lengths: dict[int, int] = {}
    finetune: list[torch.Tensor] = []

    def reclaim():  # as the lender does between steps: the allocator's own moves, then the finetune side frees
        allocator.maybe_reclaim(allow_drain=True)
        if allocator.needs_reclaim() and finetune:
            allocator.free_tensor(finetune.pop(0))
            allocator.maybe_reclaim(allow_drain=True)

    num_lent_total = 0
    for step in range(100):
        if len(lengths) < max_reqs and torch.rand(1, generator=generator).item() < 0.3:
            lengths[min(set(range(max_reqs)) - set(lengths))] = 0
        for req, length in list(lengths.items()):
            if length == max_len or (length > 5 and torch.rand(1, generator=generator).item() < 0.03):
                for (_, tokens), table in zip(sides, req_to_token):
                    tokens.free(table[req, :length].clone())
                del lengths[req]
        if not lengths:
            continue
        reqs = sorted(lengths)
        reclaim()
        for (_, tokens), table in zip(sides, req_to_token):
            new_slots = tokens.alloc(len(reqs))
            assert new_slots is not None
            for req, slot in zip(reqs, new_slots.tolist()):
                table[req, lengths[req]] = slot
        k = torch.randn(len(reqs), HEADS, HEAD_DIM, generator=generator)
        v = torch.randn(len(reqs), HEADS, HEAD_DIM, generator=generator)
        q = torch.randn(len(reqs), HEADS, HEAD_DIM, generator=generator)
        for req in reqs:
            lengths[req] += 1
        seq_lens = torch.tensor([lengths[r] for r in reqs])
        outputs = []
        for (pool, _), table in zip(sides, req_to_token):
            loc = table[reqs, seq_lens - 1]
            out = []
            for layer_id in range(LAYERS):
                pool.set_kv_buffer(None, loc, k + layer_id, v, layer_id_override=layer_id)
                o = torch.empty_like(q)
                TorchNativeAttnBackend._run_sdpa_forward_decode(
                    None, q, o, pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id), table,
                    torch.tensor(reqs), seq_lens)
                out.append(o)
            outputs.append(torch.stack(out))
        assert torch.equal(outputs[0], outputs[1]), f"step {step}: decode differs with lending"
        # Between steps the finetune side borrows, scribbles on and returns memory.
        num_lent_total += allocator.lend_chunks(int(torch.randint(0, 3, (1,), generator=generator)))
        if allocator.chunk_pool.ledger.lent_chunk_ids() and torch.rand(1, generator=generator).item() < 0.5:
            nbytes = int(torch.randint(1, 3 * config.block_bytes, (1,), generator=generator))
            try:
                tensor = allocator.chunk_pool.alloc_tensor((nbytes,), torch.uint8)
                tensor.fill_(step % 256)
                finetune.append(tensor)
            except Exception as error:  # noqa: BLE001 - only running out of lent memory is expected
                assert type(error).__name__ == "OutOfLentMemory"
        if finetune and torch.rand(1, generator=generator).item() < 0.3:
            allocator.free_tensor(finetune.pop(0))
        if torch.rand(1, generator=generator).item() < 0.2:
            for chunk_id in allocator.chunk_pool.ledger.lent_chunk_ids()[:1]:
                allocator.chunk_pool.drain(chunk_id)
            allocator.return_idle_chunks(1)
    assert num_lent_total > 0 and allocator.num_reclaimed_chunks > 0, "the run must lend and reclaim"
    allocator.close()


@pytest.mark.gpu
def test_token_alloc_and_free_make_no_device_to_host_sync_on_a_gpu():
    """Pins defect 6 of issue 11: alloc compared a released slot with free_pages on the host every time."""
    tokens = ChunkTokenToKVPoolAllocator(SIZE, torch.float32, "cuda", None, need_sort=True, slots_per_chunk=64)
    first = tokens.alloc(32)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens.free(first[:8])
        again = tokens.alloc(16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert again is not None and sorted(again.tolist())[:8] == sorted(first[:8].tolist())

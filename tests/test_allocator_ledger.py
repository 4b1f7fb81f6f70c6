"""Torch-free policy of the unified allocator: the chunk ledger under random sequences."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.chunk_ledger import ChunkLedger, ChunkState

NUM_CHUNKS = 6
BLOCKS_PER_CHUNK = 4
BLOCK_BYTES = 1000

ledger_ops = st.lists(
    st.one_of(
        st.tuples(st.just("lend"), st.integers(0, NUM_CHUNKS - 1)),
        st.tuples(st.just("reclaim"), st.integers(0, NUM_CHUNKS - 1)),
        st.tuples(st.just("place"), st.integers(1, 9 * BLOCK_BYTES)),
        st.tuples(st.just("release"), st.integers(0, 50)),
    ),
    max_size=60,
)


def check_ledger(ledger: ChunkLedger, owners: dict[int, int]) -> None:
    lent = set(ledger.lent_chunk_ids())
    assert lent == {c for c, s in enumerate(ledger.states) if s is ChunkState.LENT}
    ranges = {block_id: list(spans) for block_id, spans in ledger._spans.items()}  # used block -> spans
    for block_id, spans in ranges.items():
        assert block_id // BLOCKS_PER_CHUNK in lent, "a used block is in a KV chunk"
        spans = sorted(spans)
        assert all(0 <= start < end <= BLOCK_BYTES for start, end, _ in spans)
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), f"bytes of block {block_id} used twice"
    for owner, num_bytes in owners.items():
        assert sum(end - start for spans in ranges.values() for start, end, o in spans if o == owner) == num_bytes
    assert ledger.num_used_blocks == len(ranges)


@settings(max_examples=300, deadline=None)
@given(ledger_ops)
def test_ledger_never_double_books_and_everything_comes_home(ops):
    ledger = ChunkLedger(NUM_CHUNKS, BLOCKS_PER_CHUNK, BLOCK_BYTES)
    owners: dict[int, int] = {}
    next_owner = 0
    for op, arg in ops:
        if op == "lend":
            if ledger.states[arg] is ChunkState.KV:
                ledger.lend(arg)
            else:
                with pytest.raises(ValueError):
                    ledger.lend(arg)
        elif op == "reclaim":
            if ledger.is_idle(arg):
                ledger.reclaim(arg)
            else:
                with pytest.raises(ValueError):
                    ledger.reclaim(arg)
        elif op == "place":
            free_before = ledger.num_free_blocks
            placement = ledger.place(next_owner, arg)
            if placement is None:
                assert ledger.blocks_needed(arg) > free_before
            else:
                assert placement.num_bytes == arg
                owners[next_owner] = arg
            next_owner += 1
        elif owners:
            owner = sorted(owners)[arg % len(owners)]
            assert ledger.release(owner).num_bytes == owners.pop(owner)
        check_ledger(ledger, owners)
    for owner in list(owners):
        ledger.release(owner)
    for chunk_id in ledger.idle_chunk_ids():
        ledger.reclaim(chunk_id)
    assert ledger.states == [ChunkState.KV] * NUM_CHUNKS
    assert ledger.num_free_blocks == ledger.num_used_blocks == 0


def test_place_fills_the_fullest_chunk_first_so_others_stay_idle():
    """Pins the drain policy: with one chunk partly used, a new allocation goes there, not to an idle chunk."""
    ledger = ChunkLedger(3, 4, BLOCK_BYTES)
    ledger.lend(1)
    ledger.lend(2)
    first = ledger.place(owner=1, num_bytes=BLOCK_BYTES)
    second = ledger.place(owner=2, num_bytes=2 * BLOCK_BYTES)
    assert {b // 4 for b in second.block_ids} == {first.block_ids[0] // 4}
    assert len(ledger.idle_chunk_ids()) == 1


def test_a_tensor_tail_is_shared_with_the_next_tensor_head():
    """Pins the anti-fragmentation rule: 2.5 blocks then 1.5 blocks fill exactly 4 blocks, the second
    tensor starting in the half block the first one left."""
    ledger = ChunkLedger(1, 5, BLOCK_BYTES)
    ledger.lend(0)
    first = ledger.place(owner=1, num_bytes=2500)
    second = ledger.place(owner=2, num_bytes=1500)
    assert (first.offset_bytes, second.offset_bytes) == (0, 500)
    assert second.block_ids[0] == first.block_ids[-1]
    assert ledger.num_used_blocks == 4 and ledger.num_free_blocks == 1
    ledger.release(1)
    assert ledger.num_used_blocks == 2, "the shared block stays used by the second tensor"
    ledger.release(2)
    assert ledger.idle_chunk_ids() == [0]

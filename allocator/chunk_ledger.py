"""ChunkLedger: which chunks are KV or lent, and which bytes of which lent blocks back each tensor.

Torch-free. A tensor is a run of blocks mapped consecutively: its data starts at some offset of the
first block and ends inside the last; the blocks between are whole. Blocks are shared at byte
granularity: a tensor may start in the free suffix of a used block, end in the free prefix of another,
or fit in a free gap of one. So lent-but-unused bytes stay small instead of up to one block per tensor.
"""

from dataclasses import dataclass
from enum import Enum


class ChunkState(Enum):
    KV = "kv"
    LENT = "lent"


@dataclass(frozen=True, slots=True)
class Placement:
    block_ids: tuple[int, ...]
    """Blocks mapped consecutively at the tensor's address range."""
    offset_bytes: int
    """Where the tensor's data starts inside the first block (0 unless it shares that block)."""
    num_bytes: int


class ChunkLedger:
    """Block ids: chunk c owns blocks [c * blocks_per_chunk, (c + 1) * blocks_per_chunk).

    Whole blocks come from the fullest lent chunk first, so frees leave whole chunks idle.
    """

    def __init__(self, num_chunks: int, blocks_per_chunk: int, block_bytes: int):
        self.num_chunks = num_chunks
        self.blocks_per_chunk = blocks_per_chunk
        self.block_bytes = block_bytes
        self.states = [ChunkState.KV] * num_chunks
        self._free_blocks: dict[int, set[int]] = {}  # lent chunk -> its blocks with no user
        self._spans: dict[int, list[tuple[int, int, int]]] = {}  # used block -> sorted (start, end, owner)
        self._placements: dict[int, Placement] = {}

    def chunk_blocks(self, chunk_id: int) -> range:
        return range(chunk_id * self.blocks_per_chunk, (chunk_id + 1) * self.blocks_per_chunk)

    def lent_chunk_ids(self) -> list[int]:
        return sorted(self._free_blocks)

    def is_idle(self, chunk_id: int) -> bool:
        """Lent and none of its blocks in use: it can go back to KV."""
        return len(self._free_blocks.get(chunk_id, ())) == self.blocks_per_chunk

    def idle_chunk_ids(self) -> list[int]:
        return [c for c in self.lent_chunk_ids() if self.is_idle(c)]

    @property
    def num_free_blocks(self) -> int:
        return sum(len(free) for free in self._free_blocks.values())

    @property
    def num_used_blocks(self) -> int:
        return len(self._spans)

    def lend(self, chunk_id: int) -> None:
        if self.states[chunk_id] is not ChunkState.KV:
            raise ValueError(f"chunk {chunk_id} is already lent")
        self.states[chunk_id] = ChunkState.LENT
        self._free_blocks[chunk_id] = set(self.chunk_blocks(chunk_id))

    def reclaim(self, chunk_id: int) -> None:
        if not self.is_idle(chunk_id):
            raise ValueError(f"chunk {chunk_id} is not an idle lent chunk")
        self.states[chunk_id] = ChunkState.KV
        del self._free_blocks[chunk_id]

    def blocks_needed(self, num_bytes: int) -> int:
        """Whole free blocks an allocation of num_bytes needs at most."""
        return -(-num_bytes // self.block_bytes)

    def place(self, owner: int, num_bytes: int) -> Placement | None:
        """Room for num_bytes, or None (nothing taken) if too few lent bytes are free."""
        if owner in self._placements:
            raise ValueError(f"owner {owner} already holds blocks")
        segments = self._fit_in_gap(num_bytes) or self._fit_across_blocks(num_bytes, use_shared=True) \
            or self._fit_across_blocks(num_bytes, use_shared=False)
        if segments is None:
            return None
        for block_id, start, end in segments:
            if block_id not in self._spans:
                self._free_blocks[block_id // self.blocks_per_chunk].discard(block_id)
                self._spans[block_id] = []
            self._spans[block_id].append((start, end, owner))
            self._spans[block_id].sort()
        placement = Placement(tuple(b for b, _, _ in segments), segments[0][1], num_bytes)
        self._placements[owner] = placement
        return placement

    def placement_of(self, owner: int) -> Placement | None:
        return self._placements.get(owner)

    def release(self, owner: int) -> Placement:
        placement = self._placements.pop(owner)
        for block_id in placement.block_ids:
            spans = [span for span in self._spans[block_id] if span[2] != owner]
            if spans:
                self._spans[block_id] = spans
            else:
                del self._spans[block_id]
                self._free_blocks[block_id // self.blocks_per_chunk].add(block_id)
        return placement

    def owners_of(self, block_ids: list[int]) -> set[int]:
        """Owners with bytes in any of block_ids."""
        return {owner for block_id in block_ids for _, _, owner in self._spans.get(block_id, ())}

    def used_blocks_of(self, chunk_id: int) -> list[int]:
        return [b for b in self.chunk_blocks(chunk_id) if b in self._spans]

    def num_free_blocks_outside(self, chunk_id: int) -> int:
        return self.num_free_blocks - len(self._free_blocks.get(chunk_id, ()))

    def move_block(self, src: int, chunk_id_to_avoid: int) -> tuple[int, list[int]]:
        """Re-home used block src onto a free block of another lent chunk (fullest first): the same
        bytes at the same offsets. Returns the new block and the owners whose placements changed."""
        dst = next(b for c in sorted(self._free_blocks, key=lambda c: (len(self._free_blocks[c]), c))
                   if c != chunk_id_to_avoid for b in sorted(self._free_blocks[c]))
        self._free_blocks[dst // self.blocks_per_chunk].discard(dst)
        self._spans[dst] = self._spans.pop(src)
        self._free_blocks[src // self.blocks_per_chunk].add(src)
        owners = sorted({owner for _, _, owner in self._spans[dst]})
        for owner in owners:
            p = self._placements[owner]
            blocks = tuple(dst if b == src else b for b in p.block_ids)
            self._placements[owner] = Placement(blocks, p.offset_bytes, p.num_bytes)
        return dst, owners

    def _gaps(self, block_id: int) -> list[tuple[int, int]]:
        gaps, cursor = [], 0
        for start, end, _ in self._spans[block_id]:
            if start > cursor:
                gaps.append((cursor, start))
            cursor = end
        if cursor < self.block_bytes:
            gaps.append((cursor, self.block_bytes))
        return gaps

    def _fit_in_gap(self, num_bytes: int) -> list[tuple[int, int, int]] | None:
        """Best fit inside one used block; a gap at the block's start is filled from its end, so
        what stays free remains a prefix (usable by a tensor's last block)."""
        best = None
        for block_id in self._spans:
            for start, end in self._gaps(block_id):
                if end - start >= num_bytes and (best is None or end - start < best[0]):
                    best = (end - start, block_id, start, end)
        if best is None:
            return None
        _, block_id, start, end = best
        if start == 0:
            return [(block_id, end - num_bytes, end)]
        return [(block_id, start, start + num_bytes)]

    def _fit_across_blocks(self, num_bytes: int, use_shared: bool) -> list[tuple[int, int, int]] | None:
        head = tail = None
        head_bytes = 0
        if use_shared:
            suffixes = [(self.block_bytes - spans[-1][1], b) for b, spans in self._spans.items()]
            head_bytes, head = max(((n, b) for n, b in suffixes if 0 < n < num_bytes), default=(0, None))
        num_full, tail_bytes = divmod(num_bytes - head_bytes, self.block_bytes)
        if use_shared and tail_bytes:
            prefixes = [(spans[0][0], b) for b, spans in self._spans.items() if b != head]
            tail = min(((n, b) for n, b in prefixes if n >= tail_bytes), default=(0, None))[1]
        num_fresh = num_full + (1 if tail_bytes and tail is None else 0)
        if (head is None and tail is None and use_shared) or num_fresh > self.num_free_blocks:
            return None
        fresh = self._take_free(num_fresh)
        segments = [(head, self.block_bytes - head_bytes, self.block_bytes)] if head is not None else []
        segments += [(block_id, 0, self.block_bytes) for block_id in fresh[:num_full]]
        if tail_bytes:
            segments.append((tail if tail is not None else fresh[-1], 0, tail_bytes))
        return segments

    def _take_free(self, num_blocks: int) -> list[int]:
        taken: list[int] = []
        for chunk_id in sorted(self._free_blocks, key=lambda c: (len(self._free_blocks[c]), c)):
            taken.extend(sorted(self._free_blocks[chunk_id])[: num_blocks - len(taken)])
            if len(taken) == num_blocks:
                break
        return taken

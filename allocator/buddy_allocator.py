"""BuddyAllocator: power-of-two buddy allocation over a region of whole top-level blocks (torch-free)."""

MIN_BYTES = 2048


class BuddyAllocator:
    """Offsets into a region of num_bytes (a multiple of max_bytes); sizes from MIN_BYTES to max_bytes.

    Each max_bytes block is the root of its own buddy tree, so the region need not be a power of two.
    """

    def __init__(self, num_bytes: int, max_bytes: int, min_bytes: int = MIN_BYTES):
        if min_bytes <= 0 or max_bytes % min_bytes or (max_bytes // min_bytes) & (max_bytes // min_bytes - 1):
            raise ValueError(f"max_bytes {max_bytes} must be a power-of-two multiple of min_bytes {min_bytes}")
        if num_bytes < 0 or num_bytes % max_bytes:
            raise ValueError(f"num_bytes {num_bytes} must be a multiple of max_bytes {max_bytes}")
        self.num_bytes = num_bytes
        self.min_bytes = min_bytes
        self.max_order = (max_bytes // min_bytes).bit_length() - 1
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._free[self.max_order] = set(range(0, num_bytes, max_bytes))
        self._order_of: dict[int, int] = {}
        self.used_bytes = 0

    def order_for(self, num_bytes: int) -> int:
        return max(0, (-(-num_bytes // self.min_bytes) - 1).bit_length())

    def alloc(self, num_bytes: int) -> int | None:
        """Offset of a block of at least num_bytes (1 <= num_bytes <= max_bytes), or None when full."""
        order = self.order_for(num_bytes)
        if num_bytes <= 0 or order > self.max_order:
            raise ValueError(f"buddy allocation of {num_bytes} bytes is outside 1..{self.min_bytes << self.max_order}")
        source = next((o for o in range(order, self.max_order + 1) if self._free[o]), None)
        if source is None:
            return None
        offset = self._free[source].pop()
        while source > order:
            source -= 1
            self._free[source].add(offset + (self.min_bytes << source))
        self._order_of[offset] = order
        self.used_bytes += self.min_bytes << order
        return offset

    def free(self, offset: int) -> None:
        order = self._order_of.pop(offset, None)
        if order is None:
            raise KeyError(offset)
        self.used_bytes -= self.min_bytes << order
        while order < self.max_order:
            buddy = offset ^ (self.min_bytes << order)
            if buddy not in self._free[order]:
                break
            self._free[order].discard(buddy)
            offset = min(offset, buddy)
            order += 1
        self._free[order].add(offset)

    @property
    def num_live(self) -> int:
        return len(self._order_of)

"""The unified memory allocator: decode KV and finetune tensors over one pool of remappable chunks."""

from allocator.chunk_pool import ChunkPool, OutOfLentMemory
from allocator.config import AllocatorConfig
from allocator.unified_allocator import UnifiedAllocator

__all__ = ["AllocatorConfig", "ChunkPool", "OutOfLentMemory", "UnifiedAllocator"]

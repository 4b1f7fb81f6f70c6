"""What every harvest package may import and which imports nothing of harvest's: errors, native libraries."""

from base.errors import HarvestError

__all__ = ["HarvestError"]

"""Admin HTTP endpoint of a harvest worker: health, stats, Prometheus metrics."""

from harvest.admin.admin_server import AdminServer

__all__ = ["AdminServer"]

"""Admin HTTP endpoint of a harvest worker: health, stats, Prometheus metrics."""

from harvest.admin.admin_app import AdminServer

__all__ = ["AdminServer"]

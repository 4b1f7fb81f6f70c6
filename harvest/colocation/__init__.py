"""Co-location: the finetune job inside the decode worker, step by step under the TPOT SLO."""

from harvest.colocation.finetune_job import FinetuneJob
from harvest.colocation.temporal_controller import TemporalController

__all__ = ["FinetuneJob", "TemporalController"]

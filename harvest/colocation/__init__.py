"""Co-location: the finetune job inside the decode worker, step by step under the TPOT SLO."""

from harvest.colocation.controller import TemporalController
from harvest.colocation.finetune_job import FinetuneJob

__all__ = ["FinetuneJob", "TemporalController"]

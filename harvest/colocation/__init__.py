"""Co-location: the finetune job inside the decode worker, step by step under the TPOT SLO."""

from harvest.colocation.finetune_job import FinetuneJob
from harvest.colocation.step_controller import StepController

__all__ = ["FinetuneJob", "StepController"]

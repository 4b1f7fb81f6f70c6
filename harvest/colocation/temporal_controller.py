"""Temporal co-location (CPU hosts, GPUs without green contexts, HARLI sec. 6.2): decode owns the whole
device during its step; finetune units run only in the temporal slice after it and while no batch exists."""

from harvest.colocation.controller import Controller


class TemporalController(Controller):
    mode = "temporal"

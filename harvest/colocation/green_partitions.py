"""SM partitions of one GPU as pre-created stream pairs on disjoint green contexts (CUDA >= 12.4).

One `cuDevSmResourceSplitByCount` cuts the device into groups of the partition granularity (8 SMs on an
H100: the driver's minimum and alignment for compute capability 9.x); a partition is a run of
consecutive groups, decode taking the first `infer_sms // g` and finetune the next `ft_sms // g`. Both
come from the same split, so they are disjoint by construction. Streams are created once, at start-up,
for every partition the planner may pick; switching per step is a dictionary lookup.
"""

import logging

logger = logging.getLogger(__name__)


def _check(result):
    """cuda.bindings returns (CUresult, *values): raise on error, return the values."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver call failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


class GreenPartitions:
    def __init__(self, device_index: int, pairs: list[tuple[int, int]]):
        import torch
        from cuda.bindings import driver

        _check(driver.cuInit(0))
        self._device = _check(driver.cuDeviceGet(device_index))
        self._torch_device = torch.device("cuda", device_index)
        resource = _check(driver.cuDeviceGetDevResource(self._device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        self.num_sms = resource.sm.smCount
        major = torch.cuda.get_device_capability(device_index)[0]
        # Minimum SMs per green context and their alignment (CUDA docs, green contexts): 8 from sm_90.
        self.granularity = 8 if major >= 9 else 4 if major == 8 else 2
        max_groups = self.num_sms // self.granularity
        groups, num_groups, _remaining = _check(
            driver.cuDevSmResourceSplitByCount(max_groups, resource, 0, self.granularity))
        self._groups = list(groups)[:num_groups]
        self._streams: dict[tuple[int, int], object] = {}
        self._pairs = {}
        for infer_sms, ft_sms in pairs:
            self._pairs[(infer_sms, ft_sms)] = (self._stream_for(0, infer_sms), self._stream_for(infer_sms, ft_sms))
        logger.info("harvest: %d SM partitions on %d SMs in groups of %d", len(self._pairs), self.num_sms,
                    self.granularity)

    def streams(self, infer_sms: int, ft_sms: int):
        """(decode stream, finetune stream or None) for a partition created at start-up."""
        return self._pairs[(infer_sms, ft_sms)]

    def _stream_for(self, first_sm: int, num_sms: int):
        """A stream on a green context over SMs [first_sm, first_sm + num_sms); the whole device's own
        stream when num_sms covers it, None for zero SMs."""
        import torch
        from cuda.bindings import driver

        if num_sms == 0:
            return None
        if first_sm == 0 and num_sms >= self.num_sms:
            return torch.cuda.default_stream(self._torch_device)
        key = (first_sm, num_sms)
        if key not in self._streams:
            g = self.granularity
            if first_sm % g or num_sms % g or (first_sm + num_sms) // g > len(self._groups):
                raise ValueError(f"SMs [{first_sm}, {first_sm + num_sms}) do not fall on {g}-SM groups")
            chosen = self._groups[first_sm // g:(first_sm + num_sms) // g]
            desc = _check(driver.cuDevResourceGenerateDesc(chosen, len(chosen)))
            green_ctx = _check(driver.cuGreenCtxCreate(desc, self._device,
                                                       driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            stream = _check(driver.cuGreenCtxStreamCreate(green_ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
            self._streams[key] = torch.cuda.ExternalStream(int(stream), device=self._torch_device)
        return self._streams[key]

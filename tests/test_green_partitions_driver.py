"""GreenPartitions built from what cuDevSmResourceSplitByCount returns, on a fake `cuda.bindings.driver`
(the one stand-in: no driver here); the real driver runs in test_green_partitions.py under -m gpu."""

import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from predictor.partition_grid import PartitionGrid

OK = "CUDA_SUCCESS"


class FakeDriver:
    """The driver calls GreenPartitions makes, answering with a given split and recording contexts."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=OK)
    CUdevResourceType = SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM="sm")
    CUgreenCtxCreate_flags = SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)

    def __init__(self, num_sms: int, group_sms: list[int], remaining_sms: int):
        self.num_sms, self.group_sms, self.remaining_sms = num_sms, group_sms, remaining_sms
        self.contexts: list[tuple[int, ...]] = []

    def cuInit(self, flags):
        return (OK,)

    def cuDeviceGet(self, index):
        return OK, index

    def cuGetErrorName(self, err):
        return OK, str(err)

    def cuDeviceGetDevResource(self, device, kind):
        return OK, SimpleNamespace(sm=SimpleNamespace(smCount=self.num_sms, minSmPartitionSize=8,
                                                      smCoscheduledAlignment=8))

    def cuDevSmResourceSplitByCount(self, max_groups, resource, flags, min_count):
        groups = [SimpleNamespace(group_id=i, sm=SimpleNamespace(smCount=n)) for i, n in enumerate(self.group_sms)]
        padding = [None] * (max_groups - len(groups))
        return OK, groups + padding, len(groups), SimpleNamespace(sm=SimpleNamespace(smCount=self.remaining_sms))

    def cuDevResourceGenerateDesc(self, chosen, count):
        assert len(chosen) == count
        return OK, tuple(group.group_id for group in chosen)

    def cuGreenCtxCreate(self, desc, device, flags):
        self.contexts.append(desc)
        return OK, desc

    def cuGreenCtxStreamCreate(self, context, flags, priority):
        return OK, 1000 + len(self.contexts)


@pytest.fixture
def fake_driver(monkeypatch):
    def install(num_sms, group_sms, remaining_sms):
        import cuda.bindings

        driver = FakeDriver(num_sms, group_sms, remaining_sms)
        monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
        monkeypatch.setattr(cuda.bindings, "driver", driver, raising=False)
        monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device: ("stream", handle))
        monkeypatch.setattr(torch.cuda, "default_stream", lambda device: "default stream")
        return driver

    return install


def test_fifteen_groups_drop_what_needs_sixteen_and_create_contexts_only_when_asked(fake_driver, caplog):
    """Pins defect 3: one H100 splits into 15 groups of 8 + 12 SMs; the code assumed 16 and died at start-up
    (ValueError inside get_init_info) while creating ~136 contexts eagerly."""
    driver = fake_driver(132, [8] * 15, 12)
    from harvest.colocation.green_partitions import GreenPartitions

    grid_of = PartitionGrid.from_name("h100")
    grid = [(i, 0) for i in grid_of.infer_options()] + list(grid_of.pairs())   # a co-run profile's partitions
    with caplog.at_level(logging.WARNING):
        parts = GreenPartitions(0, grid)
    assert driver.contexts == []
    assert (64, 56) in parts.pairs and (120, 0) in parts.pairs and (132, 0) in parts.pairs
    assert {(64, 64), (128, 0), (8, 120)} <= set(parts.dropped_pairs)
    assert set(parts.pairs) | set(parts.dropped_pairs) == set(grid)
    assert all(i + f <= 120 or (i, f) == (132, 0) for i, f in parts.pairs)
    assert "cannot be formed" in caplog.text
    decode, finetune = parts.streams(64, 56)
    assert driver.contexts == [tuple(range(8)), tuple(range(8, 15))]   # disjoint runs of the split
    assert decode != finetune
    assert parts.streams(64, 56) == (decode, finetune) and parts.num_contexts == 2
    assert parts.streams(132, 0) == ("default stream", None)
    with pytest.raises(KeyError, match=r"\(64, 64\) is not formed"):
        parts.streams(64, 64)


def test_uneven_group_sizes_form_partitions_from_the_sizes_given(fake_driver):
    driver = fake_driver(64, [16, 16, 8, 8, 8], 8)
    from harvest.colocation.green_partitions import GreenPartitions

    parts = GreenPartitions(0, [(16, 16), (16, 8), (32, 16), (40, 8), (8, 0), (48, 0)])
    assert parts.pairs == [(16, 16), (32, 16), (40, 8), (48, 0)]
    assert parts.dropped_pairs == [(16, 8), (8, 0)]
    parts.prepare([(32, 16), (48, 0)])
    assert driver.contexts == [(0, 1), (2, 3), (0, 1, 2, 3)]

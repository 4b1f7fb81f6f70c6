"""GreenPartitions built from what cuDevSmResourceSplitByCount returns, and the stream groups SGLang captures
decode's CUDA graphs per, on a fake `cuda.bindings.driver` (the one stand-in: no driver here); the real driver
runs in test_green_partitions.py under -m gpu."""

import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from base.errors import HarvestError
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
        self.devices: list[int] = []

    def cuInit(self, flags):
        return (OK,)

    def cuDeviceGet(self, index):
        self.devices.append(index)
        return OK, index

    def cuDeviceGetName(self, length, device):
        return OK, b"Fake H100".ljust(length, b"\x00")

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
    assert parts.streams(132, 0) == (None, None)        # the whole device: SGLang's own streams
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


def test_stream_groups_give_each_decode_partition_the_planner_can_pick_one_graph_stream(fake_driver, monkeypatch):
    """Pins defect 1 (b): decode's CUDA graphs were captured once, on a primary-context stream, and replayed on
    the partition's green stream, where their kernels keep the primary context (all SMs). Each decode
    partition the planner can pick now gets its own SGLang stream group (one graph set captured on that very
    stream), group 0 is SGLang's own for the whole device, and a step selects its group before the forward."""
    driver = fake_driver(132, [8] * 15, 12)
    from sglang.srt.multiplex import pdmux_context

    from harvest.colocation.green_partitions import GreenPartitions
    from harvest.sglang.stream_groups import StreamGroups

    parts = GreenPartitions(0, [(64, 56), (64, 48), (32, 88), (64, 64), (132, 0)])
    co_run = [(i, f) for i, f in parts.pairs if f]
    assert co_run == [(64, 56), (64, 48), (32, 88)]          # (64, 64) cannot be formed: no group, no graphs
    parts.prepare(co_run)
    groups = StreamGroups(parts, sorted(co_run))
    decode_32, decode_64 = parts.streams(32, 88)[0], parts.streams(64, 56)[0]
    assert parts.streams(64, 48)[0] is decode_64              # one decode prefix, one stream, one graph set
    assert groups.num_groups == 3 and groups.decode_sms == [132, 32, 64]
    assert [groups.index_of(s) for s in (None, decode_32, decode_64)] == [0, 1, 2]
    assert len(driver.contexts) == 5                          # 2 decode prefixes + 3 finetune runs, nothing more

    for name in ("STREAM_GROUPS", "SM_COUNTS", "CURRENT_STREAM_IDX", "CURRENT_STREAM_GROUP"):
        monkeypatch.setattr(pdmux_context, name, getattr(pdmux_context, name))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: ("side stream", device))
    groups.install(0)
    own = ("side stream", 0)
    assert pdmux_context.get_stream_groups() == [(own, own), (decode_32, decode_32), (decode_64, decode_64)]
    assert pdmux_context.get_sm_counts() == [(0, 132), (100, 32), (68, 64)]
    assert pdmux_context.get_current_stream_idx() == 0
    assert groups.select(decode_64) == 2 and pdmux_context.get_current_stream_idx() == 2
    assert groups.select(None) == 0 and pdmux_context.get_current_stream_idx() == 0
    assert groups.select(("stream", 999)) is None             # a stream with no graph set decodes eagerly
    assert pdmux_context.get_current_stream_idx() == 0


def test_the_runtime_builds_partitions_on_the_workers_device_and_plans_only_formed_ones(fake_driver):
    """Pins defect 9: the runtime built GreenPartitions on device 0 whatever the worker's device, created no
    context up front, and let the planner pick partitions the driver's split cannot form (a KeyError at the
    first such step). On a 15-group split of device 1: contexts for exactly the co-run partitions the planner
    may pick, created at start-up; the planner never picks a dropped one."""
    from pathlib import Path

    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import HarvestRuntime
    from predictor import SplitPlanner
    from predictor.synthetic_profile import SHIPPED_PATH

    driver = fake_driver(132, [8] * 15, 12)
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cuda", yaml_path="job.yaml"), tpot_slo_ms=100.0,
                         profile_path=str(Path(SHIPPED_PATH)))
    runtime = HarvestRuntime(config)
    assert runtime.is_spatial
    parts = runtime.green_partitions(1)
    assert driver.devices == [1] and runtime.green_partitions(1) is parts      # built once, on the worker's device
    profiled = [(i, f) for i, f in runtime.profile.partitions if f]
    co_run_pairs = [(i, f) for i, f in parts.pairs if f > 0]                   # the ones the planner may pick
    assert co_run_pairs and set(co_run_pairs) < set(profiled)
    assert all(i + f <= 120 for i, f in co_run_pairs)                          # what 15 groups of 8 form
    decode_prefixes = {i for i, _ in co_run_pairs}
    runtime.prepare_co_run_contexts(parts)                                     # start(), without decode graphs
    assert parts.num_contexts == len(decode_prefixes) + len(co_run_pairs)      # one finetune run per pair

    def co_runs(planner) -> set:
        decisions = [planner.plan(batch_size, seq_len, has_ready_work=True)
                     for batch_size in (1, 8, 64, 256) for seq_len in (0.0, 512.0, 4096.0)]
        return {(d.infer_sms, d.ft_sms) for d in decisions if d.ft_sms}

    assert co_runs(SplitPlanner(runtime.profile, 100.0)) - set(parts.pairs)    # e.g. (112, 16): 128 SMs
    assert not co_runs(SplitPlanner(runtime.profile, 100.0, pairs=parts.pairs)) - set(co_run_pairs)


def test_with_decode_graphs_per_partition_the_planner_picks_and_prepares_only_partitions_with_a_graph_set(
        fake_driver):
    """Pins defect 5 (issue 30): the planner could pick, and start-up made green contexts for, every co-run
    partition of the profile. With --partition-graph-sets 2 only the two decode partitions the planner co-runs
    on most get graphs; the planner, its decisions over a grid of batches, and the contexts made at start-up
    keep to them (a partition without a set would decode eagerly, slower than the profile says)."""
    import dataclasses
    from pathlib import Path

    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import HarvestRuntime
    from harvest.sglang.stream_groups import StreamGroups
    from predictor import SplitPlanner
    from predictor.synthetic_profile import SHIPPED_PATH

    driver = fake_driver(132, [8] * 16, 4)
    # Units so short that the wait for one in flight costs a co-run nothing: the planner co-runs where the profile
    # says it gains (with the default bound it weighs that wait, and on this profile mostly keeps to the whole device).
    finetune = FinetuneConfig("cuda", yaml_path="job.yaml", max_unit_ms=0.01)
    config = ServeConfig(admin=AdminConfig(), finetune=finetune, tpot_slo_ms=100.0,
                         profile_path=str(Path(SHIPPED_PATH)), partition_graph_sets=2)
    runtime = HarvestRuntime(config)
    parts = runtime.green_partitions(0)
    capture_bs = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    pairs, max_bs = runtime.graph_plan(parts, capture_bs)
    runtime.stream_groups = StreamGroups(parts, pairs, None, config.partition_graph_sets, max_bs)
    # The synthetic H100 profile co-runs decode on 112 SMs at small batches, on 88 at batch 256.
    assert runtime.stream_groups.decode_sms == [132, 112, 88] and max_bs == 256
    explicit = HarvestRuntime(dataclasses.replace(config, partition_graph_max_bs=16))
    assert explicit.graph_plan(parts, capture_bs) == (pairs, 16)
    with_graphs = set(runtime.stream_groups.decode_sms[1:])
    assert len(with_graphs) == 2 and len({i for i, _ in parts.pairs if i < 132}) > 2
    pairs = runtime.planner_pairs(parts)
    assert pairs and {i for i, f in pairs if i < 132} == with_graphs
    runtime.prepare_co_run_contexts(parts)
    co_run = [(i, f) for i, f in pairs if f]
    assert len(driver.contexts) == len(with_graphs) + len(co_run)               # nothing for the others
    planner = SplitPlanner(runtime.profile, 100.0, pairs=pairs)
    decisions = {(d.infer_sms, d.ft_sms) for d in (planner.plan(b, s, has_ready_work=True)
                                                    for b in (1, 8, 64, 256) for s in (0.0, 512.0, 4096.0))}
    assert {i for i, f in decisions if f} <= with_graphs and any(f for _, f in decisions)


def test_the_gpu_profiled_device_samples_only_partitions_its_split_forms(fake_driver):
    """`harvest profile --co-run` on a GPU plans on the device's grid (the driver's SM count and granularity)
    and measures only the partitions a pinned worker forms there: on 15 groups of 8, nothing past 120 SMs
    but the whole device. The finetune job runs on cuda:0, on the finetune side of a formed partition."""
    from harvest.profiler.profiled_device import gpu_device
    from predictor.sampling_plan import SamplingPlan

    fake_driver(132, [8] * 15, 12)
    device = gpu_device(0)
    assert device.name == "Fake H100" and device.finetune_device == "cuda:0" and device.is_gpu
    assert device.grid(co_run=True) == PartitionGrid(132, 8)
    assert device.grid(co_run=False) == PartitionGrid(132, 132)      # solo-only: the whole device, in SMs
    device.check_co_run()
    plan = SamplingPlan(device.grid(co_run=True), 16, 1024, num_seq_levels=2, num_held_out_per_partition=1)
    kept, dropped = device.measurable(plan.points(), co_run=True)
    assert (128, 0) in dropped and all(i + f > 120 and (i, f) != (132, 0) for i, f in dropped)
    assert all(p.infer_sms + p.ft_sms <= 120 or (p.infer_sms, p.ft_sms) == (132, 0) for p in kept)
    assert {(p.infer_sms, p.ft_sms) for p in kept} | set(dropped) == {(p.infer_sms, p.ft_sms) for p in plan.points()}
    assert device.measurable(plan.points(), co_run=False) == (plan.points(), [])
    stream = device.finetune_context(56).stream
    assert stream == device.partitions.streams(64, 56)[1]            # the last groups: (64, 56) is the widest decode


def test_a_gpu_split_of_one_group_cannot_co_run(fake_driver):
    from harvest.profiler.profiled_device import gpu_device

    fake_driver(8, [8], 0)
    with pytest.raises(HarvestError, match=r"--co-run needs at least two partitions.*groups \[8\]"):
        gpu_device(0).check_co_run()


def test_a_pinned_gpu_worker_without_a_profile_captures_decode_graphs_for_its_pinned_partition_only(fake_driver):
    """Pins defect 5 (issue 30): a worker pinned without a profile (the profiler's) made a stream group, so a
    full decode graph set, of every formed decode prefix (15 here, 16-17 on an H100). Now only the pinned
    partition's decode gets one; the profiler pins solo partitions too, e.g. (120, 0): the whole device needs
    no extra set, (120, 0) gets one, and a partition pinned later decodes eagerly (no set, select -> None)."""
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import HarvestRuntime
    from harvest.sglang.stream_groups import StreamGroups

    driver = fake_driver(132, [8] * 15, 12)
    for pinned, decode_sms in (((132, 0), [132]), ((120, 0), [132, 120])):
        config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cuda", yaml_path="job.yaml"),
                             tpot_slo_ms=1.0, pinned_partition=pinned)
        runtime = HarvestRuntime(config)
        parts = runtime.green_partitions(0)
        assert (120, 0) in parts.pairs and (8, 112) in parts.pairs and (128, 0) not in parts.pairs
        pairs, max_bs = runtime.graph_plan(parts, [1, 2, 4, 8])
        assert (pairs, max_bs) == ([], None)                            # no profile: every size, pinned only
        groups = StreamGroups(parts, pairs, pinned, max_bs=max_bs)
        assert groups.decode_sms == decode_sms
    assert driver.contexts == [tuple(range(15))]                    # the one decode prefix, no finetune runs
    assert groups.index_of(parts.streams(120, 0)[0]) == 1 and groups.index_of(parts.streams(8, 0)[0]) is None
    assert groups.group_max_bs == [None, None]


def test_a_pinned_partition_the_split_cannot_form_is_refused_at_start_up(fake_driver):
    """Else the worker started and its first step found no stream for the partition (KeyError in the step)."""
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import HarvestRuntime

    fake_driver(132, [8] * 15, 12)
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cuda", yaml_path="job.yaml"), tpot_slo_ms=1.0,
                         pinned_partition=(64, 64))
    with pytest.raises(HarvestError, match=r"--pin-partition \(64, 64\).*groups \[8, 8"):
        HarvestRuntime(config).green_partitions(0)

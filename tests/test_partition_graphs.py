"""Decode graph sets per partition stream through SGLang's real CudaGraphRunner.capture / can_run / replay,
with harvest's hooks around them (defect 5 of issue 30: one full set per stream group, 17 on an H100).

What is patched, and why: `CudaGraphRunner.capture_one_batch_size` records what it is asked to capture (batch
size, group, the stream capture() entered) instead of creating a torch.cuda.CUDAGraph, synchronizing the
device and running the model twice: all three need CUDA. `graph_capture` (parallel_state) yields the stream it
is given without the TP group's stream switch (no torch.distributed here); `get_available_gpu_memory`, the TP
rank and `enable_num_token_non_padded` read the device, the TP group and the MoE EP group. The green contexts
come from the fake driver of test_green_partitions_driver.py; attention backends are recorders. Run as is:
SGLang's capture loop over groups and batch sizes, its graph keys, maybe_init_pdmux, can_run, replay_prepare's
padding (DecodeInputBuffers on the CPU), replay, and ModelRunner._forward_raw's graph-or-eager dispatch.
`__init__` is not run (it builds attention backends and buffers on a CUDA device and captures at once): the
runner gets the attributes it would have set; harvest's hooks wrap the methods as HookRegistry's AROUND does.
"""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from test_green_partitions_driver import fake_driver  # noqa: F401 (a fixture)

CAPTURE_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]       # a short SGLang cuda_graph_bs


class FakeGraph:
    def __init__(self, bs, stream_idx, stream):
        self.bs, self.stream_idx, self.stream = bs, stream_idx, stream
        self.num_replays = 0

    def replay(self):
        self.num_replays += 1


class FakeAttnBackend:
    def __init__(self):
        self.replays = []

    def init_cuda_graph_state(self, max_bs, max_num_token):
        pass

    def init_forward_metadata_replay_cuda_graph(self, bs, *args, **kwargs):
        self.replays.append(bs)


@pytest.fixture
def graph_runner(fake_driver, monkeypatch):  # noqa: F811
    """A decode CudaGraphRunner after harvest's maybe_init_pdmux: 132 SMs in 15 groups of 8, a profile whose
    co-run partitions decode on 8..112 SMs beside finetune on the rest of 120, the worker pinned to (64, 56)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor import cuda_graph_runner as cgr
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.multiplex import pdmux_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from harvest.colocation.green_partitions import GreenPartitions
    from harvest.sglang import hooks
    from harvest.sglang.stream_groups import StreamGroups

    fake_driver(132, [8] * 15, 12)
    for name in ("STREAM_GROUPS", "SM_COUNTS", "CURRENT_STREAM_IDX", "CURRENT_STREAM_GROUP"):
        monkeypatch.setattr(pdmux_context, name, getattr(pdmux_context, name))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: ("side stream", device))
    entered = []

    class GraphCapture:
        def __init__(self, stream=None):
            self.stream = stream if stream is not None else ("sglang capture stream", 0)

        def __enter__(self):
            entered.append(self.stream)
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cgr, "graph_capture", GraphCapture)
    monkeypatch.setattr(cgr, "get_available_gpu_memory", lambda *args, **kwargs: 80.0)
    monkeypatch.setattr(cgr, "get_tensor_model_parallel_rank", lambda: 1)
    monkeypatch.setattr(cgr, "enable_num_token_non_padded", lambda: False)     # reads the MoE EP group
    monkeypatch.setattr(parallel_state, "_ENABLE_PDMUX_P_TP", parallel_state._ENABLE_PDMUX_P_TP)

    def capture_one_batch_size(self, bs, forward, stream_idx=None):
        # What the real one returns: the graph, and the output buffers replay slices ([bs, vocab] logits).
        return FakeGraph(bs, stream_idx, self.stream), LogitsProcessorOutput(next_token_logits=torch.zeros(bs, 7))

    def hooked(around, original):
        return lambda self, *args, **kwargs: around(original, self, *args, **kwargs)

    monkeypatch.setattr(cgr.CudaGraphRunner, "capture", hooked(hooks.around_capture, cgr.CudaGraphRunner.capture))
    monkeypatch.setattr(cgr.CudaGraphRunner, "capture_one_batch_size",
                        hooked(hooks.around_capture_one_batch_size, capture_one_batch_size))
    monkeypatch.setattr(cgr.CudaGraphRunner, "can_run", hooked(hooks.around_can_run, cgr.CudaGraphRunner.can_run))

    parts = GreenPartitions(0, [(i, 120 - i) for i in range(8, 113, 8)])
    assert len(parts.pairs) == 14
    free = iter(range(80 << 30, 0, -(1 << 20)))                                # 1 MiB less per reading
    groups = StreamGroups(parts, parts.pairs, (64, 56), max_sets=3, max_bs=16, free_bytes=lambda: next(free))
    groups.install(0)

    model_runner = SimpleNamespace(
        device="cuda", gpu_id=0, is_draft_worker=False, model=SimpleNamespace(forward=lambda *args: None),
        tp_group=None, server_args=SimpleNamespace(enable_cudagraph_gc=False, enable_return_hidden_states=False),
        spec_algorithm=SpeculativeAlgorithm.NONE, hisparse_coordinator=None, device_timer=None,
        decode_attn_backend_group=[FakeAttnBackend() for _ in range(groups.num_groups)])
    runner = object.__new__(cgr.CudaGraphRunner)
    runner.__dict__.update(
        model_runner=model_runner, graphs={}, output_buffers={}, enable_profile_cuda_graph=False,
        capture_bs=list(CAPTURE_BS), compile_bs=[], max_bs=max(CAPTURE_BS), max_num_token=max(CAPTURE_BS),
        num_tokens_per_bs=1, enable_pdmux=True, disable_padding=False, require_mlp_tp_gather=False,
        require_mlp_sync=False, require_gathered_buffer=False, is_encoder_decoder=False, is_dllm=False,
        enable_two_batch_overlap=False, nsa_enable_prefill_cp=False, capture_hidden_mode=CaptureHiddenMode.NULL,
        capture_forward_mode=None, record_nolora_graph=False, seq_len_fill_value=1,
        deepep_adapter=cgr.DeepEPCudaGraphRunnerAdapter(), harvest_stream_groups=groups,
        buffers=cgr.DecodeInputBuffers.create(
            device="cpu", max_bs=max(CAPTURE_BS), max_num_token=max(CAPTURE_BS), hidden_size=8, vocab_size=7,
            dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False, require_mlp_tp_gather=False,
            seq_len_fill_value=1, encoder_len_fill_value=0, num_tokens_per_bs=1, cache_loc_dtype=torch.int64,
            enable_mamba_track=False))
    runner.maybe_init_pdmux()                                   # SGLang's: stream groups from pdmux_context
    runner.capture()
    return SimpleNamespace(runner=runner, groups=groups, parts=parts, entered=entered)


def decode_batch(batch_size):
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    def ints(fill):
        return torch.full((batch_size,), fill, dtype=torch.int64)

    return SimpleNamespace(
        batch_size=batch_size, replace_embeds=None, capture_hidden_mode=CaptureHiddenMode.NULL, spec_info=None,
        forward_mode=ForwardMode.DECODE, input_ids=ints(5), req_pool_indices=ints(0), seq_lens=ints(9),
        seq_lens_cpu=ints(9), out_cache_loc=ints(3), positions=ints(8), mrope_positions=None, encoder_lens=None,
        mamba_track_indices=None, mamba_track_mask=None, ngram_embedding_info=None, out_cache_loc_swa=None,
        seq_lens_sum=9 * batch_size, lora_ids=None, global_num_tokens_cpu=None, num_token_non_padded=None,
        prepare_attn_tp_scatter_input=lambda model_runner: None)


def run_step(setup, decode_stream, batch_size):
    """What a spatial step does: select the partition's group (StepStreams.run), then SGLang's own
    ModelRunner._forward_raw replays a graph if the runner's can_run says so, else calls forward_decode (the
    eager forward, here recorded). The graph replayed, or None where the step decoded eagerly."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    setup.groups.select(decode_stream)
    batch = decode_batch(batch_size)
    eager = []
    model_runner = SimpleNamespace(device="cuda", graph_runner=setup.runner, hisparse_coordinator=None,
                                   forward_decode=lambda forward_batch, **kwargs: eager.append(forward_batch))
    before = {key: graph.num_replays for key, graph in setup.runner.graphs.items()}
    output = ModelRunner._forward_raw(model_runner, batch, skip_attn_backend_init=False, pp_proxy_tensors=None)
    replayed = [key for key, graph in setup.runner.graphs.items() if graph.num_replays != before[key]]
    if not output.can_run_graph:
        assert eager == [batch] and replayed == []
        return None
    assert eager == [] and len(replayed) == 1
    assert output.logits_output.next_token_logits.shape[0] == batch_size
    return setup.runner.graphs[replayed[0]]


def test_one_capped_graph_set_per_group_used_keyed_as_replay_reads_them(graph_runner):
    """Pins defect 5: SGLang captured every cuda_graph_bs on every stream group, and harvest made a group of
    every formed decode partition. Now: group 0 (the whole device) holds every size, on SGLang's own capture
    stream; only the 3 decode partitions wanted most get a set, on their own green stream: the pinned 64
    (every step runs there) every size, the 2 others sizes <= 16; nothing else is captured."""
    from sglang.srt.multiplex import pdmux_context

    runner, groups, parts = graph_runner.runner, graph_runner.groups, graph_runner.parts
    assert groups.decode_sms == [132, 64, 8, 16]                                # pinned, then as wanted
    assert groups.uncaptured_sms == [*range(24, 57, 8), *range(72, 113, 8)]
    stream_groups = pdmux_context.get_stream_groups()
    assert graph_runner.entered == [pair[1] for pair in stream_groups]           # one capture pass per group
    small = [bs for bs in CAPTURE_BS if bs <= 16]
    expected = {0: CAPTURE_BS, 1: CAPTURE_BS, 2: small, 3: small}
    for group, sizes in expected.items():
        for bs in CAPTURE_BS:
            key = runner._make_graph_key(bs, group)                             # SGLang's key, as replay builds it
            assert (key in runner.graphs) == (bs in sizes), key
            if bs in sizes:
                graph = runner.graphs[key]
                assert (graph.bs, graph.stream_idx, graph.stream) == (bs, group, stream_groups[group][1])
                assert key in runner.output_buffers
    assert len(runner.graphs) == 2 * len(CAPTURE_BS) + 2 * len(small)
    assert stream_groups[1][1] is parts.streams(64, 56)[0] and stream_groups[0][1] == ("side stream", 0)
    stats = groups.stats()
    assert stats["captured_bs"] == [CAPTURE_BS, CAPTURE_BS, small, small] and stats["max_bs"] == [None, None, 16, 16]
    # Each capture read the free memory before and after (1 MiB less per reading): 1 MiB per graph.
    assert stats["capture_mib"] == [len(CAPTURE_BS), len(CAPTURE_BS), len(small), len(small)]
    assert stats["total_capture_mib"] == 2 * len(CAPTURE_BS) + 2 * len(small)


def test_a_step_replays_the_graph_captured_on_its_own_stream_and_a_batch_over_the_cap_decodes_eagerly(graph_runner):
    """The graph a step replays is the one captured on its partition's stream, padded as SGLang pads (5 -> 8);
    a batch over the cap (17 -> would pad to 24, not captured there) is not sent to group 0's graph, whose
    kernels keep the primary context (every SM): can_run says no and SGLang's model runner runs it eagerly, on
    the partition's stream. The whole device replays every size; a partition with no set decodes eagerly."""
    parts, runner, groups = graph_runner.parts, graph_runner.runner, graph_runner.groups
    decode_8 = parts.streams(8, 112)[0]
    graph = run_step(graph_runner, decode_8, 5)
    assert (graph.stream_idx, graph.bs, graph.stream) == (2, 8, decode_8)
    assert runner.model_runner.decode_attn_backend_group[2].replays == [8]      # the group's own backend
    assert run_step(graph_runner, decode_8, 16).bs == 16
    assert run_step(graph_runner, decode_8, 17) is None
    assert groups.num_eager_steps == 1
    graph = run_step(graph_runner, None, 17)
    assert (graph.stream_idx, graph.bs) == (0, 24)
    graph = run_step(graph_runner, parts.streams(64, 56)[0], 17)                # the pinned one holds every size
    assert (graph.stream_idx, graph.bs) == (1, 24)
    assert run_step(graph_runner, parts.streams(16, 104)[0], 3).stream_idx == 3
    assert run_step(graph_runner, parts.streams(32, 88)[0], 3) is None           # 32 SMs: no set of its own
    assert groups.num_eager_steps == 2 and groups.stats()["num_eager_steps"] == 2


@pytest.mark.parametrize("field, value, message",
                         [("partition_graph_sets", -1, "--partition-graph-sets must be >= 0"),
                          ("partition_graph_max_bs", 0, "--partition-graph-max-bs must be >= 1")])
def test_bad_graph_set_flags_are_one_line_errors(field, value, message):
    from base.errors import HarvestError
    from harvest.config import AdminConfig, ServeConfig

    with pytest.raises(HarvestError, match=message):
        ServeConfig(admin=AdminConfig(), **{field: value})


def test_a_profiling_worker_gives_every_partition_it_pins_a_graph_set():
    """`harvest profile --co-run` pins partitions through the admin API: its worker is told to capture a graph set
    on every decode partition of the grid, up to the largest batch measured, so a visit replays graphs as a
    served step does; a worker pinned without that flag captures only the pinned partition's set."""
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.profiler.live_profile import LiveProfileConfig, _co_run_flags
    from harvest.runtime import HarvestRuntime
    from predictor.partition_grid import PartitionGrid

    grid = PartitionGrid.from_name("h100")
    flags = _co_run_flags(LiveProfileConfig(out="p.json", finetune="job.yaml", co_run=True, max_batch_size=6), grid)
    num_sets = int(flags[flags.index("--partition-graph-sets") + 1])
    assert num_sets == len({infer for infer, _ in grid.pairs()}) > 1
    assert flags[flags.index("--partition-graph-max-bs") + 1] == "6"
    partitions = SimpleNamespace(pairs=list(grid.pairs()))
    job = {"admin": AdminConfig(), "finetune": FinetuneConfig("cuda", yaml_path="job.yaml"), "tpot_slo_ms": 1.0}
    profiling = HarvestRuntime(ServeConfig(**job, pinned_partition=(grid.num_sms, 0), partition_graph_sets=num_sets,
                                           partition_graph_max_bs=6))
    assert profiling.graph_plan(partitions, CAPTURE_BS) == (partitions.pairs, 6)
    pinned = HarvestRuntime(ServeConfig(**job, pinned_partition=(64, 56)))
    assert pinned.graph_plan(partitions, CAPTURE_BS) == ([], None) and pinned.graph_sets == 4


def test_a_gpu_worker_without_a_profile_chooses_between_the_whole_device_and_the_even_split(fake_driver):  # noqa: F811
    """No profile and no pin on a GPU: spatial, the split chosen live between the whole device and the even split
    ((64, 56) of an H200's 15 groups of 8 SMs + 12), whose decode gets a graph set of every batch size and whose
    green contexts are made at start-up; nothing else is captured or created. Pinned, the worker captures only
    its own partition's set."""
    from harvest.colocation.green_partitions import GreenPartitions
    from harvest.config import AdminConfig, Colocation, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.jobs import JobSet
    from harvest.runtime import HarvestRuntime, _build_controller

    driver = fake_driver(132, [8] * 15, 12)
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cuda", yaml_path="job.yaml"), tpot_slo_ms=40.0)
    runtime = HarvestRuntime(config)
    assert runtime.colocation is Colocation.SPATIAL
    partitions = runtime.spatial_partitions(0)
    assert isinstance(partitions, GreenPartitions) and len(partitions.pairs) > 100
    assert runtime.graph_plan(partitions, CAPTURE_BS) == ([(64, 56)], None)
    runtime.prepare_co_run_contexts(partitions)
    assert driver.contexts == [tuple(range(8)), tuple(range(8, 15))]
    controller = _build_controller(config, None, None, partitions, None, JobSet())
    try:
        assert controller.chooser.splits == [None, (64, 56)] and controller.chooser.current == (64, 56)
    finally:
        controller.close()
    pinned = HarvestRuntime(dataclasses.replace(config, pinned_partition=(32, 88)))
    assert pinned.graph_plan(pinned.spatial_partitions(0), CAPTURE_BS) == ([], None)

"""The decode step's stream hand-off (harvest/sglang/step_streams.py) on recording fake CUDA streams (the one
stand-in: no CUDA here): the waits happen in order, tensors crossing streams get record_stream, and under the
overlap schedule the partition's stream becomes SGLang's forward stream. The real streams run in the -m gpu
tests at the end and in `harvest doctor` (gpu_handoff)."""

from types import SimpleNamespace

import pytest
import torch

from harvest.sglang.step_streams import StepStreams


class FakeStream:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))

    def __repr__(self):
        return self.name


class FakeTensor:
    is_cuda = True

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def record_stream(self, stream):
        self.log.append(("record", self.name, stream.name))


@pytest.fixture
def cuda(monkeypatch):
    """torch.cuda's current stream and stream context, recorded."""
    log = []
    state = SimpleNamespace(log=log, current=FakeStream("schedule", log))

    class StreamContext:
        """Re-enterable, as torch's is (SGLang enters its forward_stream_ctx once per step)."""

        def __init__(self, stream):
            self.stream, self.previous = stream, None

        def __enter__(self):
            self.previous, state.current = state.current, self.stream
            log.append(("enter", self.stream.name))

        def __exit__(self, *exc):
            log.append(("exit", self.stream.name))
            state.current = self.previous

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state.current)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    return state


def make_batch(log):
    return SimpleNamespace(input_ids=FakeTensor("input_ids", log), seq_lens=FakeTensor("seq_lens", log),
                           seq_lens_cpu=torch.ones(2, dtype=torch.int64), reqs=[1, 2],
                           sampling_info=SimpleNamespace(temperatures=FakeTensor("temperatures", log)))


def test_without_overlap_decode_waits_for_its_inputs_and_the_schedule_stream_for_its_outputs(cuda):
    """Pins defect 2: the hook switched to the partition's stream with no wait in either direction, so decode
    could read inputs the schedule stream had not written and SGLang could read tokens not yet sampled."""
    log = cuda.log
    decode = FakeStream("decode", log)
    kv_streams = []
    streams = StepStreams(SimpleNamespace(enable_overlap=False), on_forward_stream=kv_streams.append)

    def forward():
        log.append(("forward on", cuda.current.name))
        return SimpleNamespace(next_token_ids=FakeTensor("next_token_ids", log), copy_done=None,
                               logits_output=SimpleNamespace(next_token_logits=FakeTensor("logits", log)))

    result = streams.run(forward, decode, make_batch(log))
    assert log == [
        ("wait", "decode", "schedule"),
        ("record", "input_ids", "decode"), ("record", "seq_lens", "decode"), ("record", "temperatures", "decode"),
        ("enter", "decode"), ("forward on", "decode"), ("exit", "decode"),
        ("wait", "schedule", "decode"),
        ("record", "next_token_ids", "schedule"), ("record", "logits", "schedule"),
    ]
    assert result.next_token_ids.name == "next_token_ids"
    assert kv_streams == [decode]          # lending waits for the work decode queued on its stream

    log.clear()
    streams.run(lambda: log.append(("forward on", cuda.current.name)), None, make_batch(log))
    assert log == [("forward on", "schedule")]          # the whole device: SGLang's own stream, no hand-off


def test_with_overlap_the_partition_stream_is_sglangs_forward_stream_after_the_previous_one(cuda):
    """Pins defect 1 (a): under the overlap schedule run_batch enters SGLang's forward_stream_ctx, so decode ran
    on SGLang's own forward stream (every SM) whatever stream the hook entered."""
    log = cuda.log
    sglang_forward = FakeStream("sglang_forward", log)
    scheduler = SimpleNamespace(enable_overlap=True, forward_stream=sglang_forward, schedule_stream=cuda.current,
                                forward_stream_ctx=torch.cuda.stream(sglang_forward))
    kv_streams = []
    streams = StepStreams(scheduler, on_forward_stream=kv_streams.append)

    def run_batch():
        # What Scheduler.run_batch does under the overlap schedule.
        with scheduler.forward_stream_ctx:
            scheduler.forward_stream.wait_stream(scheduler.schedule_stream)
            log.append(("forward on", cuda.current.name))

    decode_a, decode_b = FakeStream("decode_a", log), FakeStream("decode_b", log)
    for stream in (decode_a, decode_a, decode_b, None):
        streams.run(run_batch, stream, make_batch(log))
    forwards = [entry for entry in log if entry[0] in ("forward on", "wait")]
    assert forwards == [
        ("wait", "decode_a", "sglang_forward"),        # the new forward stream after the previous one
        ("wait", "decode_a", "schedule"), ("forward on", "decode_a"),
        ("wait", "decode_a", "schedule"), ("forward on", "decode_a"),
        ("wait", "decode_b", "decode_a"),
        ("wait", "decode_b", "schedule"), ("forward on", "decode_b"),
        ("wait", "sglang_forward", "decode_b"),        # back to SGLang's own stream for the whole device
        ("wait", "sglang_forward", "schedule"), ("forward on", "sglang_forward"),
    ]
    assert scheduler.forward_stream is sglang_forward
    assert kv_streams[0] is sglang_forward and set(kv_streams) == {sglang_forward, decode_a, decode_b}
    assert not any(entry[0] == "record" for entry in log)   # SGLang keeps the overlap step's tensors alive


@pytest.mark.gpu
def test_handed_off_decode_reads_late_inputs_and_returns_finished_outputs():
    """The real streams: the schedule stream writes inputs after a long kernel; the forward on another stream
    doubles them; the schedule stream reads the result back. Equal on every try."""
    schedule, decode = torch.cuda.Stream(), torch.cuda.Stream()
    streams = StepStreams(SimpleNamespace(enable_overlap=False))
    big = torch.randn(4096, 4096, device="cuda")
    with torch.cuda.stream(schedule):
        for value in range(20):
            inputs = torch.empty(1 << 20, device="cuda")
            for _ in range(4):
                big @ big                                       # keep the schedule stream busy
            inputs.fill_(value)
            batch = SimpleNamespace(input_ids=inputs, sampling_info=None)
            result = streams.run(lambda b=batch: SimpleNamespace(next_token_ids=b.input_ids * 2), decode, batch)
            assert result.next_token_ids.sum().item() == 2 * value * (1 << 20)


@pytest.mark.gpu
def test_overlap_forward_streams_switch_on_real_streams():
    """The partition stream becomes the forward stream, and results written on the previous forward stream are
    visible to the next (the overlap schedule's future map)."""
    sglang_forward = torch.cuda.Stream()
    scheduler = SimpleNamespace(enable_overlap=True, forward_stream=sglang_forward,
                                forward_stream_ctx=torch.cuda.stream(sglang_forward))
    streams = StepStreams(scheduler)
    future = torch.zeros(1 << 20, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    partitions = [torch.cuda.Stream(), torch.cuda.Stream(), None]

    def run_batch(step):
        with scheduler.forward_stream_ctx:
            assert torch.cuda.current_stream() == scheduler.forward_stream
            seen = future.clone()
            for _ in range(4):
                big @ big
            future.fill_(step)
            return seen

    for step in range(1, 10):
        seen = streams.run(lambda s=step: run_batch(s), partitions[step % 3], None)
        scheduler.forward_stream.synchronize()
        assert seen.sum().item() == (step - 1) * (1 << 20)


@pytest.mark.gpu
@pytest.mark.sglang
def test_spatial_worker_with_cuda_graphs_and_overlap_decodes_on_partition_streams(tmp_path):
    """The real path under SGLang's GPU defaults (CUDA graphs, overlap schedule): decode graphs are captured
    once per partition stream (stream groups > 1), steps run on partitions narrower than the device, and the
    greedy tokens equal those of a worker without harvest's finetune job, so no hand-off race corrupts them
    (kernels are the same on every stream; the first tokens of every request must match)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from conftest import free_port
    from test_colocation_e2e import write_job

    from harvest.models import ensure_embedded_model
    from harvest.worker.client import prefilled_request, read_stats, wait_for_stats
    from harvest.worker.process import WorkerProcess
    from predictor.synthetic_profile import SHIPPED_PATH

    model_dir = ensure_embedded_model()
    base = ["--model-path", str(model_dir), "--max-total-tokens", "16384", "--disaggregation-transfer-backend", "fake"]

    def outputs(worker) -> list[list[int]]:
        def one(n):
            body = prefilled_request([3 + n, 4, 5, 6 + n], 24, room=n + 1)
            response = httpx.post(f"{worker.url}/generate", json=body, timeout=120)
            assert response.status_code == 200, response.text
            return response.json()["output_ids"]

        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, range(16)))

    with WorkerProcess(base, free_port(), free_port(), tmp_path / "plain.log") as plain:
        expected = outputs(plain)
    job = write_job(tmp_path, model_dir)
    args = [*base, "--finetune", str(job), "--tpot-slo-ms", "200", "--profile", str(SHIPPED_PATH),
            "--allow-synthetic-profile"]
    with WorkerProcess(args, free_port(), free_port(), tmp_path / "spatial.log") as worker:
        wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "running", "the job running")
        actual = outputs(worker)
        stats = read_stats(worker.admin_url)
    colocation = stats["colocation"]
    assert colocation["mode"] == "spatial"
    assert int(colocation["decode_stream_groups"].split()[0]) >= 2
    assert colocation["partitions"]["num_sms"] > 0
    assert [ids[:8] for ids in actual] == [ids[:8] for ids in expected]

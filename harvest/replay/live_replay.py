"""Live replay: send a trace to a running `harvest serve` at the trace's times and record what it did.

Each request goes out as a pre-filled decode request (fake transfer: context length -> that many input
ids, GeneratedTokens -> max_new_tokens with ignore_eos). Sent to the router of a PD deployment (`harvest
deploy`) it is a real one: the router overwrites the bootstrap fields with its prefill worker's, so the
prompt is prefilled and its KV transferred (tests/test_pd_deploy.py pins this). At most `max_concurrency` are in flight; a
request that finds every slot taken waits, and the wait counts as its queue delay. Per-step latency comes
from the worker's own records (`GET /harvest/steps`, polled while replaying); TPOT is per request, client
side: (response time - send time) / tokens, so it includes the worker's scheduling of the request.
Finetune progress is the admin API's `finetune` section, read before and after.
"""

import asyncio
import datetime
import time
from collections.abc import Callable

import httpx
import numpy as np

from base.errors import HarvestError
from harvest.replay.policy_summary import SCHEMA_VERSION, binned_series, cdf, decode_metrics
from harvest.worker.client import generate_prefilled, read_steps_after
from traces.trace import Trace

# Token ids for the fake prefill: any ids the model's vocabulary holds; the values do not matter to decode.
FIRST_TOKEN_ID = 3
NUM_TOKEN_IDS = 200
STEPS_POLL_S = 0.5
NO_FINETUNE_NOTE = "the worker reports no finetune section: no finetune job ran, or the worker predates it"


class LiveReplay:
    def __init__(
        self,
        target_url: str,
        admin_url: str,
        tpot_slo_ms: float,
        max_concurrency: int = 64,
        num_series_points: int = 600,
        drain_s: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        """`drain_s`: how long after the last arrival unfinished requests are waited for, then cancelled.
        `transport`: where HTTP goes (default the network; tests pass an in-process worker stand-in)."""
        if max_concurrency < 1:
            raise HarvestError(f"--concurrency must be >= 1, got {max_concurrency}")
        self.target_url, self.admin_url = target_url.rstrip("/"), admin_url.rstrip("/")
        self.tpot_slo_ms, self.max_concurrency = tpot_slo_ms, max_concurrency
        self.num_series_points = num_series_points
        if not drain_s > 0:
            raise HarvestError(f"--drain-s must be > 0, got {drain_s}")
        self.drain_s = drain_s
        self.transport = transport
        self.steps: list[dict] = []
        """The worker's step records (GET /harvest/steps) over the last run, oldest first."""

    def run(self, trace: Trace, on_done: Callable[[int], None] | None = None) -> dict:
        return asyncio.run(self._run(trace, on_done))

    async def _run(self, trace: Trace, on_done) -> dict:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None), transport=self.transport) as client:
            before = await self._admin(client, "/harvest/stats")
            since = int(before.get("decode", {}).get("decode_steps", 0))
            steps: list[dict] = []
            self.steps = steps
            stop = asyncio.Event()
            poller = asyncio.create_task(self._poll_steps(client, since, steps, stop))
            slots = asyncio.Semaphore(self.max_concurrency)
            n = trace.num_requests
            sent_s, done_s, tokens, errors = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64), []
            started_wall, started = time.time(), time.perf_counter()

            async def send(i: int) -> None:
                try:
                    ids = [FIRST_TOKEN_ID + j % NUM_TOKEN_IDS for j in range(max(1, int(trace.context_tokens[i])))]
                    sent_s[i] = time.perf_counter() - started
                    reply = await generate_prefilled(
                        client, self.target_url, ids, int(trace.generated_tokens[i]), room=i
                    )
                    done_s[i] = time.perf_counter() - started
                    tokens[i] = int(
                        reply.get("meta_info", {}).get("completion_tokens", len(reply.get("output_ids", [])))
                    )
                except (httpx.HTTPError, ValueError) as e:
                    errors.append(f"request {i}: {type(e).__name__}: {e}")
                finally:
                    slots.release()
                    if on_done is not None:
                        on_done(i)

            deadline_s = trace.duration_s + self.drain_s
            tasks = []
            for i in range(n):
                delay = trace.arrival_s[i] - (time.perf_counter() - started)
                if delay > 0:
                    await asyncio.sleep(delay)
                try:
                    await asyncio.wait_for(slots.acquire(), max(deadline_s - (time.perf_counter() - started), 0.0))
                except TimeoutError:
                    break
                tasks.append(asyncio.create_task(send(i)))
            remaining_s = max(deadline_s - (time.perf_counter() - started), 0.0)
            unfinished = (await asyncio.wait(tasks, timeout=remaining_s))[1] if tasks else set()
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            num_unfinished = len(unfinished) + n - len(tasks)
            if num_unfinished:
                errors.append(
                    f"{num_unfinished} requests unfinished (or never sent) {self.drain_s:g} s after the "
                    "last arrival: the worker cannot serve this rate; lower --rate-scale or cap lengths"
                )
            elapsed_s = time.perf_counter() - started
            await asyncio.sleep(STEPS_POLL_S)
            stop.set()
            await poller
            after = await self._admin(client, "/harvest/stats")
        return self._results(
            trace, steps, started_wall, elapsed_s, sent_s, done_s, tokens, errors, num_unfinished, before, after
        )

    async def _admin(self, client: httpx.AsyncClient, path: str) -> dict:
        try:
            response = await client.get(f"{self.admin_url}{path}")
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise HarvestError(self._unreadable(self.admin_url + path, e)) from None
        return response.json()

    @staticmethod
    def _unreadable(url: str, error: Exception) -> str:
        return f"cannot read {url} (is `harvest serve` running with this --admin-port?): {error}"

    async def _poll_steps(self, client: httpx.AsyncClient, since: int, steps: list[dict], stop: asyncio.Event):
        while True:
            is_last = stop.is_set()
            try:
                new_steps, since = await read_steps_after(client, self.admin_url, since)
            except httpx.HTTPError as e:
                raise HarvestError(self._unreadable(self.admin_url + "/harvest/steps", e)) from None
            steps += new_steps
            if is_last:
                return
            try:
                await asyncio.wait_for(stop.wait(), STEPS_POLL_S)
            except TimeoutError:
                pass

    def _results(
        self, trace, steps, started_wall, elapsed_s, sent_s, done_s, tokens, errors, num_unfinished, before, after
    ) -> dict:
        ok = tokens > 0
        num_failed = sum(e.startswith("request ") for e in errors)
        # A step's time is what its requests waited for, as the simulator counts it: the decode step, the
        # finetune slice after it and an idle-time unit it waited for (the worker's SLO verdict, is_slo_met).
        decode_ms = np.array([s["latency_ms"] for s in steps], dtype=float)
        latency = decode_ms + np.array([(s.get("finetune_ms") or 0.0) + (s.get("idle_wait_ms") or 0.0)
                                        for s in steps], dtype=float)
        batch = np.array([s["batch_size"] for s in steps], dtype=np.int64)
        kv = np.array([s["kv_tokens"] for s in steps], dtype=float)
        t = np.array([s["end_s"] - started_wall for s in steps], dtype=float)
        tpot_ms = (done_s[ok] - sent_s[ok]) / tokens[ok] * 1e3
        queue_s = np.maximum(sent_s[ok] - trace.arrival_s[ok], 0.0)
        finetune = self._finetune(before.get("finetune"), after.get("finetune"), elapsed_s)
        entry = {
            "status": "ok",
            "reason": None,
            "num_decode_devices": 1,
            "has_finetune_device": False,
            "decode": {
                **decode_metrics(latency, batch, tpot_ms, queue_s, self.tpot_slo_ms),
                "makespan_s": round(elapsed_s, 3),
                "num_steps_over_target_by_decode_alone": int(np.sum(decode_ms > self.tpot_slo_ms)),
                "num_failed_requests": num_failed,
                "num_unfinished_requests": num_unfinished,
                "num_tokens_returned": int(tokens.sum()),
                "num_tokens_asked": int(trace.generated_tokens.sum()),
            },
            "finetune": finetune,
            "co_run_step_fraction": None,
            "tpot_cdf_ms": cdf(tpot_ms),
            "step_latency_cdf_ms": cdf(latency),
            "series": binned_series(
                t,
                elapsed_s,
                self.num_series_points,
                step_latency_ms=latency,
                batch_size=batch,
                kv_tokens=kv,
                finetune_ms=np.array([s.get("finetune_ms") or 0.0 for s in steps]),
            ),
        }
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": "live",
            "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "target": self.target_url,
            "admin": self.admin_url,
            "trace": trace.summary(),
            "config": {
                "tpot_slo_ms": self.tpot_slo_ms,
                "max_concurrency": self.max_concurrency,
            },
            "notes": [*errors[:20], *([] if after.get("finetune") else [NO_FINETUNE_NOTE])],
            "policies": {"live": entry},
            "replay_s": round(elapsed_s, 3),
        }

    def _finetune(self, before: dict | None, after: dict | None, elapsed_s: float) -> dict:
        out = {
            "tokens_per_s": None,
            "samples_per_s": None,
            "decode_device_tokens_per_s": None,
            "finetune_device_tokens_per_s": 0.0,
            "ratio_to_separate": None,
            "ratio_to_static": None,
            "num_steps": None,
            "before": before,
            "after": after,
        }
        if not after:
            return out
        if "tokens" in after and before and "tokens" in before:
            rate = (after["tokens"] - before["tokens"]) / elapsed_s
        else:
            rate = after.get("mean_tokens_per_s") or after.get("tokens_per_s")
        if "step" in after:
            out["num_steps"] = after["step"] - (before or {}).get("step", 0)
        if rate is not None:
            out.update(tokens_per_s=rate, decode_device_tokens_per_s=rate)
        if "samples" in after:  # the job's optimizer steps x samples per step
            out["samples_per_s"] = (after["samples"] - (before or {}).get("samples", 0)) / elapsed_s
        return out

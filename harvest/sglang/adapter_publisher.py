"""Publishes the adapter being trained into the worker that trains it, through SGLang's own LoRA path
from tensors.

SGLang keeps the LoRA name -> id registry in its tokenizer manager (the HTTP server's process), so a
published adapter goes in by SGLang's `/load_lora_adapter_from_tensors` route on each worker's port (a PD
deployment's prefill workers first, then this worker): the tokenizer manager registers the name and hands
the tensors to the scheduler, which loads them in its own thread between batches
(Scheduler.load_lora_adapter_from_tensors; hooks.py times that and charges it to the next decode step).
A new version is loaded under the same name, which harvest's workers take as an atomic replace
(lora_replace.py): each request runs on the version its name pointed to when it was received.

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

import base64
import logging
import pickle
import queue
import threading
import time
from dataclasses import dataclass

import httpx

from base.errors import HarvestError
from harvest.sglang.lora_flags import lora_flags_for

logger = logging.getLogger(__name__)


class AdapterTarget:
    """The SGLang workers a job's adapter is published into, and what their LoRA flags let in: a job submitted
    to a running worker is checked against the flags SGLang started with (they cannot change without a
    restart), then gets a publisher of its own under its adapter name."""

    def __init__(self, worker_urls: list[str], server_args) -> None:
        self.worker_urls = list(worker_urls)
        self._argv = _lora_argv(server_args)
        self._is_cpu_host = server_args.device == "cpu"

    def check(self, llamafactory) -> None:
        missing = lora_flags_for(llamafactory, self._argv, self._is_cpu_host)
        if missing:
            raise HarvestError(f"publish_every_steps: this worker's SGLang was started without {' '.join(missing)}, "
                               "so it cannot load the job's adapter (restart it with them, or drop publishing)")

    def publisher(self, name: str) -> "AdapterPublisher":
        return AdapterPublisher(self.worker_urls, name)


def _lora_argv(server_args) -> list[str]:
    """The LoRA flags SGLang runs with, as argv (what lora_flags_for reads)."""
    if not server_args.enable_lora:
        return []  # the backend's default means nothing without LoRA
    argv = ["--enable-lora"]
    if server_args.max_lora_rank is not None:
        argv += ["--max-lora-rank", str(server_args.max_lora_rank)]
    if server_args.lora_target_modules:
        argv += ["--lora-target-modules", *sorted(server_args.lora_target_modules)]
    if server_args.lora_backend:
        argv += ["--lora-backend", server_args.lora_backend]
    return argv


@dataclass(slots=True)
class _Version:
    version: int
    step: int
    fleet_round: int | None
    tensors: dict
    config_dict: dict


class AdapterPublisher:
    def __init__(self, worker_urls: list[str], name: str, timeout_s: float = 300.0):
        """`worker_urls`: every SGLang worker that loads each version, in order: a PD deployment's prefill
        workers (they compute the prompts of requests naming it), then this worker."""
        self.worker_urls = list(worker_urls)
        self.name = name
        self._timeout_s = timeout_s
        self._pending: queue.Queue[_Version] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._num_requested = 0
        self._stats = {"name": name, "version": 0, "step": None, "fleet_round": None, "published_utc": None, "snapshot_ms": None,
                       "load_ms": None, "num_published": 0, "num_dropped": 0, "num_failed": 0,
                       "scheduler_ms_total": 0.0, "error": None}
        self._thread = threading.Thread(target=self._serve, name="harvest-publish", daemon=True)
        self._thread.start()

    # ---- scheduler thread ----

    def publish(self, tensors: dict, config_dict: dict, step: int, snapshot_started_s: float,
                fleet_round: int | None = None) -> int:
        """Queue this adapter (host copies nothing else holds) as the next version (an older one not yet sent
        is dropped); returns its number. The caller timed the snapshot from `snapshot_started_s`; serializing
        happens in the publishing thread, off the scheduler thread."""
        with self._lock:
            self._num_requested += 1
            version = self._num_requested
            self._stats["snapshot_ms"] = round((time.perf_counter() - snapshot_started_s) * 1e3, 3)
        try:
            self._pending.get_nowait()
            with self._lock:
                self._stats["num_dropped"] += 1  # a newer version came before the older one was sent
        except queue.Empty:
            pass
        self._pending.put(_Version(version, step, fleet_round, tensors, config_dict))
        return version

    def note_scheduler_ms(self, verb: str, duration_ms: float) -> None:
        """SGLang's own load or unload of a version, timed in the scheduler thread (hooks.py) and charged to
        the next decode step; scheduler_ms_total sums what was charged."""
        with self._lock:
            if verb == "load":
                self._stats["load_ms"] = round(duration_ms, 3)
            self._stats["scheduler_ms_total"] = round(self._stats["scheduler_ms_total"] + duration_ms, 3)

    # ---- any thread ----

    def wait_published(self, version: int, timeout_s: float) -> bool:
        """True once `version` (or a later one) is served, False on timeout or a failed publish."""
        deadline = time.monotonic() + timeout_s
        with self._done:
            while self._stats["version"] < version and self._stats["error"] is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
            return self._stats["version"] >= version

    def stats(self) -> dict:
        with self._lock:
            return {**self._stats, "version_requested": self._num_requested}

    # ---- publishing thread ----

    def _serve(self) -> None:
        while True:
            item = self._pending.get()
            error = None
            try:
                self._load(item)
            except Exception as e:  # noqa: BLE001 - a failed publish is reported, training and serving go on
                error = f"{type(e).__name__}: {e}"
                logger.error("harvest: publishing adapter %s version %d failed: %s", self.name, item.version, error)
            with self._done:
                self._stats["error"] = error  # the last attempt's: a later version that loads clears it
                if error is not None:
                    self._stats["num_failed"] += 1
                else:
                    self._stats.update(version=item.version, step=item.step, fleet_round=item.fleet_round,
                                       num_published=self._stats["num_published"] + 1,
                                       published_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                self._done.notify_all()

    def _load(self, item: _Version) -> None:
        with httpx.Client(timeout=self._timeout_s) as client:
            for url in self.worker_urls:
                # A name already loaded is replaced atomically there (lora_replace.py).
                payload = _payload(self.name, item, by_handle=url == self.worker_urls[-1])
                _check(client.post(f"{url}/load_lora_adapter_from_tensors", json=payload), "load", url)


def _payload(name: str, item: _Version, by_handle: bool) -> dict:
    """SGLang's /load_lora_adapter_from_tensors body. `by_handle`: this worker, SGLang's own serializer
    (tensors by shared-memory handle; serialized per load, a handle is handed over once). Another worker
    (a prefill worker) is another process tree, whose multiprocessing authkey differs, so it cannot take a
    handle ("digest sent was rejected", and its scheduler dies): the tensors go by value, plain pickle, which
    SGLang's deserializer reads too."""

    from sglang.srt.utils.common import MultiprocessingSerializer

    if by_handle:
        tensors = MultiprocessingSerializer.serialize(item.tensors, output_str=True)
    else:
        tensors = base64.b64encode(pickle.dumps(item.tensors)).decode("ascii")
    return {"lora_name": name, "config_dict": item.config_dict, "serialized_tensors": tensors}


def _check(response: httpx.Response, verb: str, url: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"SGLang at {url} refused to {verb} the adapter ({response.status_code}): "
                           f"{response.text[:300]}")

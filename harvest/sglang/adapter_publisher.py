"""Publishes the adapter being trained into the worker that trains it, through SGLang's own LoRA path
from tensors.

SGLang keeps the LoRA name -> id registry in its tokenizer manager (the HTTP server's process), so a
published adapter goes in by SGLang's `/load_lora_adapter_from_tensors` route on the worker's own port:
the tokenizer manager registers the name and hands the tensors to the scheduler, which loads them in its
own thread between batches (Scheduler.load_lora_adapter_from_tensors; hooks.py times that and charges
it to the next decode step). A new version replaces the last by SGLang's `/unload_lora_adapter` then load:
SGLang's unload waits for the requests running on the old version, so each request runs on one version
(the one registered under the name when SGLang's tokenizer manager received it); a request that arrives
between the unload and the load is refused with SGLang's "not loaded" 400.
"""

import logging
import queue
import threading
import time
from dataclasses import dataclass

import httpx

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Version:
    version: int
    step: int
    payload: dict


class AdapterPublisher:
    def __init__(self, worker_url: str, name: str, timeout_s: float = 300.0):
        self.worker_url = worker_url
        self.name = name
        self._timeout_s = timeout_s
        self._pending: queue.Queue[_Version] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._num_requested = 0
        self._is_loaded = False
        self._stats = {"name": name, "version": 0, "step": None, "published_utc": None, "snapshot_ms": None,
                       "load_ms": None, "num_published": 0, "error": None}
        self._thread = threading.Thread(target=self._serve, name="harvest-publish", daemon=True)
        self._thread.start()

    # ---- scheduler thread ----

    def publish(self, tensors: dict, config_dict: dict, step: int, snapshot_started_s: float) -> int:
        """Queue this adapter as the next version (an older one not yet sent is dropped); returns its number.
        The caller timed the snapshot from `snapshot_started_s`; serializing is part of that cost."""
        from sglang.srt.utils.common import MultiprocessingSerializer

        payload = {"lora_name": self.name, "config_dict": config_dict,
                   "serialized_tensors": MultiprocessingSerializer.serialize(tensors, output_str=True)}
        with self._lock:
            self._num_requested += 1
            version = self._num_requested
            self._stats["snapshot_ms"] = round((time.perf_counter() - snapshot_started_s) * 1e3, 3)
        try:
            self._pending.get_nowait()
        except queue.Empty:
            pass
        self._pending.put(_Version(version, step, payload))
        return version

    def note_load_ms(self, load_ms: float) -> None:
        """SGLang's own load of a version, timed in the scheduler thread (hooks.py)."""
        with self._lock:
            self._stats["load_ms"] = round(load_ms, 3)

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
                self._stats["error"] = error
                if error is None:
                    self._stats.update(version=item.version, step=item.step, num_published=self._stats["num_published"] + 1,
                                       published_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                self._done.notify_all()

    def _load(self, item: _Version) -> None:
        with httpx.Client(base_url=self.worker_url, timeout=self._timeout_s) as client:
            if self._is_loaded:
                _check(client.post("/unload_lora_adapter", json={"lora_name": self.name}), "unload")
                self._is_loaded = False
            _check(client.post("/load_lora_adapter_from_tensors", json=item.payload), "load")
            self._is_loaded = True


def _check(response: httpx.Response, verb: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"SGLang refused to {verb} the adapter ({response.status_code}): {response.text[:300]}")

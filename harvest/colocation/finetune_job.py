"""The finetune job as the decode worker sees it: a state machine around the engine that never lets a
finetune failure reach serving.

Runs in the scheduler thread (units, checkpoints); the admin thread only flips flags and reads the
stats cached after each unit.

Deferred imports: torch, the engine's results and the fleet's checkpoint are imported where a job builds or trains, not
when the runtime imports the job class.
"""

import dataclasses
import functools
import gc
import logging
import threading
import time
import traceback
from enum import Enum

from base.errors import HarvestError
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.publishing import adapter_config_dict, adapter_tensors

logger = logging.getLogger(__name__)

PUBLISH_UNIT = "publish"
"""The unit kind of a publish's snapshot (beside the engine's UNIT_KINDS)."""


class FinetuneState(str, Enum):
    STARTING = "starting"    # engine being built (model, dataset) in a background thread
    RUNNING = "running"      # units run whenever the controller finds room
    PAUSED = "paused"        # paused by the operator (admin API)
    STARVED = "starved"      # ready to run, but no step has left room for a unit lately
    WAITING = "waiting"      # the next unit's layer is still being fetched (weight swap)
    STOPPED = "stopped"      # checkpointed and stopped for shutdown
    FAILED = "failed"        # raised: memory and SMs released, serving goes on
    FINISHED = "finished"    # reached max_steps; adapter written


_BUILD_LOCK = threading.Lock()
"""One engine build at a time in a process: LlamaFactory's training setup resets Accelerate's process-global
AcceleratorState, so two jobs building at once break each other's."""

ACTIVE_PHASES = (FinetuneState.RUNNING, FinetuneState.STARVED, FinetuneState.WAITING)
ENDED_PHASES = (FinetuneState.STOPPED, FinetuneState.FAILED, FinetuneState.FINISHED)
HELD_MEMORY_STATS = ("window", "resident_layers", "resident_bytes", "frozen_bytes")


class FinetuneJob:
    STARVED_AFTER_S = 2.0

    def __init__(self, config: FinetuneConfig, engine_factory=None, weight_memory=None, served_weights=None,
                 fleet_join=None):
        """`weight_memory`: where the engine's resident frozen weights live (KV chunks lent by the worker's
        unified allocator); None: torch's allocator. `served_weights`: the worker's resident weights
        (harvest.finetune.base_weights.ServedWeights), computed on in place when the job's base model is the
        served model. `fleet_join(engine) -> (FleetSync, tensor names)`: join the job's fleet once the engine
        is built (`harvest serve --fleet`); None: the job trains alone."""
        self.config = config
        self._engine_factory = engine_factory or functools.partial(_build_engine, weight_memory=weight_memory,
                                                                   served_weights=served_weights)
        self.engine = None
        # The phase is set by the scheduler thread only; pausing is a separate flag the admin thread sets,
        # so neither overwrites the other (state combines them).
        self._phase = FinetuneState.STARTING
        self.error: str | None = None
        self._is_paused = False
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        self._last_unit_s = time.monotonic()
        self._num_units = 0
        self._num_tokens = 0
        self._num_samples = 0
        """Samples trained: optimizer steps x samples per step (micro-batch rows x accumulation steps)."""
        self._samples_per_step = 0
        self._is_ready = False
        self._unit_ms_total = 0.0
        self._stats: dict = {}
        self.publisher = None
        """An AdapterPublisher (set by the worker when the job's YAML publishes); None: no publishing."""
        self._publish_requested = threading.Event()
        self._is_publish_due = False
        """A version is due (a step end hit publish_every_steps, or the admin asked): the next unit is the
        snapshot ("publish"), which the controller fits in slack like any unit (scheduler thread)."""
        self._fleet_join = fleet_join
        self.fleet = None
        """The job's FleetSync (harvest.fleet) once joined: rounds start and apply at optimizer-step ends."""
        self._fleet_names: list[str] = []
        self._step_tokens = 0
        self.requested_unit_ms: float | None = None
        self._builder = threading.Thread(target=self._build, name="harvest-finetune-build", daemon=True)

    @property
    def state(self) -> FinetuneState:
        if self._is_paused and self._phase in ACTIVE_PHASES:
            return FinetuneState.PAUSED
        return self._phase

    @property
    def is_active(self) -> bool:
        """Built and neither ended nor failed (paused counts): the engine exists and holds its memory."""
        return self._phase in ACTIVE_PHASES

    def start(self) -> None:
        self._builder.start()

    def wait_built(self, timeout_s: float) -> bool:
        """Block until the engine is built (or failed to build); True if it finished in time."""
        self._builder.join(timeout_s)
        return not self._builder.is_alive()

    def _build(self) -> None:
        try:
            with _BUILD_LOCK:
                self.engine = self._engine_factory(self.config)
            args = self.engine.llamafactory.training_args
            self._samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
            if self.config.resume:
                logger.info("harvest: finetune job resumed at step %d", self.engine.global_step)
            if self._fleet_join is not None:
                self.fleet, self._fleet_names = self._fleet_join(self.engine)
            self._refresh_stats()
            self._phase = FinetuneState.RUNNING
            self._refresh_readiness()
        except Exception as e:  # noqa: BLE001 - any failure of the job must stay in the job
            self._fail(e)
            return
        # The worker's long-lived objects (SGLang's model and pools, the engine, its dataset and optimizer)
        # all exist now: freeze them out of the cyclic GC (SGLang's freeze_gc), whose full collections walk
        # every one of them while holding the GIL, so a step in flight waits for it (eval/README.md).
        gc.freeze()

    # ---- scheduler thread ----

    def poll(self) -> None:
        """The scheduler thread's explicit turn between units: checkpoint and stop if the admin thread asked,
        fail the job if its engine broke, and note whether the next unit is ready (has_ready_work reads it)."""
        if self._stop_requested.is_set():
            self._stop()
            return
        if self._publish_requested.is_set() and self._phase in ACTIVE_PHASES and not self.engine.is_mid_update:
            self._publish_requested.clear()
            self._is_publish_due = True
        self._refresh_readiness()

    def has_ready_work(self) -> bool:
        """Whether a unit may run now, as of the last poll() or unit; changes nothing. A due publish runs
        even while paused: a paused job still publishes on request, after the rest of an optimizer update it
        was paused in (a part-applied update is neither step's adapter)."""
        if self._phase not in ACTIVE_PHASES:
            return False
        if self._is_publish_due:
            return True
        is_publish_waiting = self._publish_requested.is_set() and self.engine.is_mid_update
        return self._is_ready and (not self._is_paused or is_publish_waiting)

    def _refresh_readiness(self) -> None:
        if self._phase not in ACTIVE_PHASES:
            self._is_ready = False
            return
        try:
            self._is_ready = self.engine.has_ready_work()
        except Exception as e:  # noqa: BLE001
            self._fail(e)
            return
        if not self._is_ready:
            self._phase = FinetuneState.WAITING

    @property
    def max_unit_ms(self) -> float | None:
        """What units are sized to stay under: the bound asked for (request_unit_bound), else the config's; None:
        not split on time."""
        if self.config.max_unit_ms is None:
            return None
        return self.requested_unit_ms or self.config.max_unit_ms

    def request_unit_bound(self, max_unit_ms: float | None) -> None:
        """Size the units planned from now on to `max_unit_ms` (None: the config's bound); the owner of the job
        applies it before its next unit, the engine at its next optimizer step. Any thread: a co-run unit's
        controller asks from the scheduler thread while the unit thread owns the job."""
        self.requested_unit_ms = max_unit_ms

    def next_unit_kind(self) -> str:
        return PUBLISH_UNIT if self._is_publish_due else self.engine.next_unit_kind()

    def next_unit_predicted_ms(self) -> float | None:
        """FinetuneEngine.next_unit_predicted_ms (None for a publish, or a job without an engine)."""
        if self._is_publish_due or self.engine is None:
            return None
        return self.engine.next_unit_predicted_ms()

    def run_unit(self):
        """Run one unit; returns its UnitResult, or None if the job failed or finished doing it."""
        if self._is_publish_due:
            return self._publish_unit()
        try:
            bound_ms = self.max_unit_ms
            if bound_ms is not None and bound_ms != self.engine.max_unit_ms:
                self.engine.set_unit_bound(bound_ms)
            result = self.engine.run_next_unit()
        except Exception as e:  # noqa: BLE001
            self._fail(e)
            return None
        self._phase = FinetuneState.RUNNING
        self._last_unit_s = time.monotonic()
        self._num_units += 1
        self._num_tokens += result.num_trained_tokens
        self._step_tokens += result.num_trained_tokens
        self._unit_ms_total += result.duration_ms
        if result.is_step_end:
            self._num_samples += self._samples_per_step
            started = time.perf_counter()
            try:
                self._fleet_step_end()
            except Exception as e:  # noqa: BLE001 - a broken fleet fails the job, never the worker
                self._fail(e)
                return None
            if self.fleet is not None:
                # The round's work on this thread (the adapter's copies, applying a round, the writer's
                # checkpoint) runs in this unit's slot: charged to it, so the unit times the controller
                # plans with include it.
                fleet_ms = (time.perf_counter() - started) * 1e3
                self._unit_ms_total += fleet_ms
                result = dataclasses.replace(result, duration_ms=result.duration_ms + fleet_ms)
            self._refresh_stats()
            every = self.publish_every_steps
            if every is not None and self.engine.global_step % every == 0:
                self._is_publish_due = True
            if self.engine.is_finished:
                if self._is_publish_due:
                    self._publish_unit()  # the last version goes out before the job ends
                self._finish()
        self._refresh_readiness()
        return result

    def note_no_room(self) -> None:
        """The controller had ready work but no room for it; long enough, and the job is starved."""
        if self._phase == FinetuneState.RUNNING and time.monotonic() - self._last_unit_s > self.STARVED_AFTER_S:
            self._phase = FinetuneState.STARVED

    @property
    def publish_every_steps(self) -> int | None:
        """None in a fleet: what it publishes is the fleet's adapter, after each round."""
        publishing = self.engine.llamafactory.publishing if self.engine is not None else None
        if publishing is None or self.publisher is None or self.fleet is not None:
            return None
        return publishing.every_steps

    def _fleet_step_end(self) -> None:
        """Hand the step's tokens to the fleet (a round may start on its thread); after a round is applied, its
        writer checkpoints the fleet's adapter and every member publishes it (the round is its version)."""
        tokens, self._step_tokens = self._step_tokens, 0
        if self.fleet is None:
            return
        applied = self.fleet.on_step_end(tokens)
        if applied is None or not applied.committed:
            return
        if applied.is_writer:
            from harvest.fleet.round_checkpoint import write_round_checkpoint

            write_round_checkpoint(self._fleet_adapter(), applied.round, self.fleet.checkpoint_dir)
        if self.publisher is not None:
            self._is_publish_due = True

    def _fleet_adapter(self) -> dict:
        return dict(zip(self._fleet_names, self.fleet.base_tensors()))

    def _publish_unit(self):
        """The "publish" unit: snapshot the adapter and hand it to the publisher, whose thread serializes it
        and asks SGLang to load it (between batches; hooks.py charges that to the next step). Timed like a
        unit, so the controller fits it in a step's slack by its own estimate."""
        from harvest.finetune.finetune_engine import UnitResult

        self._is_publish_due = False
        started = time.perf_counter()
        try:
            if self.fleet is None:
                tensors, fleet_round = adapter_tensors(self.engine.peft_model), None
            else:
                tensors = self._fleet_adapter()
                fleet_round = 0 if self.fleet.last is None else self.fleet.last.round
            self.publisher.publish(tensors, adapter_config_dict(self.engine.peft_model), self.engine.global_step,
                                   started, fleet_round)
        except Exception as e:  # noqa: BLE001 - a failed publish must not stop training or serving
            logger.error("harvest: snapshotting the adapter for publishing failed: %s", e)
        duration_ms = (time.perf_counter() - started) * 1e3
        self._num_units += 1
        self._unit_ms_total += duration_ms
        return UnitResult(PUBLISH_UNIT, None, 0, duration_ms, 0, self.engine.global_step, False, None)

    # ---- admin thread ----

    def request_publish(self, timeout_s: float) -> dict:
        """Publish the adapter as of the last optimizer step; returns the publisher's stats once served."""
        if self.publisher is None:
            raise HarvestError("the job does not publish its adapter: set publish_every_steps or publish_name "
                               "in its YAML")
        if self._phase not in ACTIVE_PHASES:
            raise HarvestError(f"cannot publish a finetune job that is {self.state.value}")
        if self.engine.global_step == 0:
            raise HarvestError("the job has made no optimizer step yet: nothing to publish")
        # Wait for a version asked for after this call: one an automatic publish queued earlier may still be
        # loading and carry an older step.
        version_before = self.publisher.stats()["version_requested"]
        self._publish_requested.set()
        deadline = time.monotonic() + timeout_s
        while self._publish_requested.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._publish_requested.is_set() or not self.publisher.wait_published(version_before + 1,
                                                                                  deadline - time.monotonic()):
            stats = self.publisher.stats()
            raise HarvestError(f"the adapter was not published within {timeout_s:.0f} s"
                               + (f": {stats['error']}" if stats["error"] else ""))
        return self.publisher.stats()


    def pause(self) -> None:
        self._check_controllable("pause")
        self._is_paused = True

    def resume(self) -> None:
        self._check_controllable("resume")
        self._is_paused = False

    def request_stop(self, timeout_s: float) -> bool:
        """Ask the scheduler thread to checkpoint and stop; True once done (or nothing to do)."""
        if self._phase in ENDED_PHASES:
            return True
        if self._phase == FinetuneState.STARTING:
            self.wait_built(timeout_s)
        self._stop_requested.set()
        return self._stopped.wait(timeout_s)

    def stats(self) -> dict:
        return {
            "state": self.state.value,
            "error": self.error,
            "num_units": self._num_units,
            "unit_ms_mean": round(self._unit_ms_total / self._num_units, 3) if self._num_units else None,
            "tokens": self._num_tokens,
            "samples": self._num_samples,
            **self._stats,
            "published": None if self.publisher is None else self.publisher.stats(),
            **({} if self.fleet is None else {"fleet": self.fleet.stats()}),
        }

    # ---- internals ----

    def _check_controllable(self, verb: str) -> None:
        if self._phase in ENDED_PHASES:
            raise HarvestError(f"cannot {verb} a finetune job that is {self.state.value}")

    def _refresh_stats(self) -> None:
        stats = dict(self.engine.stats())
        stats.pop("state", None)  # the engine's own view; the job's state is the one that counts here
        self._stats = stats

    def _stop(self) -> None:
        if self._phase not in ENDED_PHASES:
            try:
                if self.engine is not None:
                    # close(): a part-applied optimizer update is finished first; if that was the last step,
                    # the adapter is written too.
                    path = self.engine.close()
                    logger.info("harvest: finetune checkpoint written to %s", path)
                self._phase = FinetuneState.STOPPED
                self._release()  # a job stopped in a running worker (cancelled) gives its memory back
            except Exception as e:  # noqa: BLE001
                self._fail(e)
        self._stopped.set()

    def _finish(self) -> None:
        try:
            self.engine.close()
            self._phase = FinetuneState.FINISHED
        except Exception as e:  # noqa: BLE001
            self._fail(e)
            return
        self._release()

    def _fail(self, error: BaseException) -> None:
        self._phase = FinetuneState.FAILED
        self.error = f"{type(error).__name__}: {error}"
        logger.error("harvest: finetune job failed, serving continues:\n%s",
                     "".join(traceback.format_exception(error)))
        self._release()
        self._stopped.set()

    def _release(self) -> None:
        """Drop the engine so its memory (weights, activations, optimizer state) goes back; its resident
        window is evicted first, so memory lent from KV is freed into the allocator, not leaked."""
        device = self.config.device
        if self.fleet is not None:
            try:
                self.fleet.close()  # the round in flight is applied or dropped; the member leaves the fleet
            except Exception:  # noqa: BLE001 - a broken fleet link is dropped all the same
                logger.exception("harvest: leaving the fleet")
        if self.engine is not None:
            try:
                self.engine.set_window(0)
            except Exception:  # noqa: BLE001 - a broken engine is dropped all the same
                logger.exception("harvest: evicting the failed job's window")
        self.engine = None
        # The last stats were taken while the window was resident: they must not outlive the memory.
        self._stats = {k: v for k, v in self._stats.items() if k not in HELD_MEMORY_STATS}
        gc.unfreeze()  # the engine's cycles were frozen at build: collectable again
        gc.collect()
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


def _build_engine(config: FinetuneConfig, weight_memory=None, served_weights=None):
    from harvest.finetune import FinetuneEngine

    return FinetuneEngine.from_yaml(config.yaml_path, config=config, model_path=config.model_path,
                                    weight_memory=weight_memory, served_weights=served_weights)

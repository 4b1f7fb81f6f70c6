"""`--colocation`: the mode decided in one place (harvest.config.colocation_mode), bad combinations refused."""

import dataclasses
import os

import pytest

from base.errors import HarvestError
from harvest.config import AdminConfig, Colocation, ServeConfig, colocation_mode
from harvest.finetune import FinetuneConfig
from predictor import Profile

CO_RUN_PROFILE = "predictor/profiles/cpu-cores-smollm2-135m.json"
TEMPORAL_PROFILE = "predictor/profiles/cpu-smollm2-135m.json"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def serve_config(finetune=True, **kwargs) -> ServeConfig:
    job = FinetuneConfig("cpu", yaml_path="job.yaml") if finetune else None
    return ServeConfig(admin=AdminConfig(), finetune=job, tpot_slo_ms=None if job is None else 40.0, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "profile_path", "mode"),
    [
        ({"finetune": False}, None, Colocation.OFF),
        ({}, None, Colocation.SPATIAL if TWO_CORES else Colocation.TEMPORAL),  # the split chosen live
        ({"colocation": Colocation.TEMPORAL}, None, Colocation.TEMPORAL),
        ({"profile_path": TEMPORAL_PROFILE}, TEMPORAL_PROFILE, Colocation.TEMPORAL),
        ({"profile_path": CO_RUN_PROFILE}, CO_RUN_PROFILE, Colocation.SPATIAL),
        ({"pinned_partition": (1, 1)}, None, Colocation.SPATIAL),
        ({"profile_path": CO_RUN_PROFILE, "colocation": Colocation.TEMPORAL}, CO_RUN_PROFILE, Colocation.TEMPORAL),
        ({"colocation": Colocation.SPATIAL, "pinned_partition": (1, 1)}, None, Colocation.SPATIAL),
        ({"finetune": False, "colocation": Colocation.OFF}, None, Colocation.OFF),
    ],
)
def test_the_mode_is_today_s_inference_unless_named(kwargs, profile_path, mode):
    profile = None if profile_path is None else Profile.load(profile_path)
    assert colocation_mode(serve_config(**kwargs), profile) is mode


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"colocation": Colocation.OFF}, "--colocation off serves only"),
        ({"finetune": False, "colocation": Colocation.TEMPORAL}, "--colocation temporal needs --tpot-slo-ms"),
        ({"colocation": Colocation.TEMPORAL, "pinned_partition": (1, 1)}, "--pin-partition is spatial"),
    ],
)
def test_bad_combinations_are_one_line_errors(kwargs, fragment):
    with pytest.raises(HarvestError, match=fragment) as error:
        serve_config(**kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.skipif(not TWO_CORES, reason="a host of two cores or more chooses its split")
def test_spatial_without_a_profile_or_a_pin_is_a_gpu_or_a_cpu_host_of_two_cores_or_more_choosing_its_split(
        monkeypatch):
    assert colocation_mode(serve_config(colocation=Colocation.SPATIAL), None) is Colocation.SPATIAL
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(HarvestError, match="--colocation spatial on a one-core host needs --pin-partition"):
        serve_config(colocation=Colocation.SPATIAL)
    assert colocation_mode(serve_config(), None) is Colocation.TEMPORAL, "one core: nothing to split"
    # A GPU's SMs split whatever cores the host gives the worker.
    gpu = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cuda", yaml_path="job.yaml"), tpot_slo_ms=40.0)
    assert colocation_mode(gpu, None) is Colocation.SPATIAL
    assert colocation_mode(dataclasses.replace(gpu, colocation=Colocation.SPATIAL), None) is Colocation.SPATIAL


def test_spatial_with_a_profile_without_co_run_partitions_is_refused():
    config = serve_config(colocation=Colocation.SPATIAL, profile_path=TEMPORAL_PROFILE)
    with pytest.raises(HarvestError, match="no co-run partitions"):
        colocation_mode(config, Profile.load(TEMPORAL_PROFILE))

import os
import random
import socket
import sys

import pytest

# Test processes share the harvest conventions of the CLI edge: no hub access, SGLang's CPU engine on CPU hosts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; this host has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from harvest.models.tiny_llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


def free_port() -> int:
    """A free port below 40000: SGLang derives side ports (gRPC = port + 3000) that must stay valid."""
    for port in random.sample(range(20000, 40000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-40000")


@pytest.fixture
def harvest_cli():
    """Argv prefix that runs the harvest CLI of this checkout in this interpreter."""
    return [sys.executable, "-m", "harvest.cli.main"]

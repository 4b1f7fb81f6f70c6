"""What the target GPU image already holds (the device's KINDS.md, 'cuda' image).

The bundle carries a distribution the runtime imports unless the image has one that fits.
"""

IMAGE_DISTRIBUTIONS = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn shellingham
sentence-transformers sentencepiece setuptools simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

IMAGE_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "transformers": "5.17.0", "triton": "3.6.0",
}
"""Versions seen there (KINDS.md's pip list); for the others only the name is known."""

NEVER_CARRIED = frozenset({"torch", "triton", "harvest", "flashinfer-cubin"})
"""torch and triton: the image's CUDA build, which a wheel from here would replace; harvest: built from this
checkout; flashinfer-cubin: optional precompiled kernels (361 MB) that flashinfer JIT-builds with nvcc instead."""

KEPT_FROM_IMAGE = frozenset({"numpy"})
"""Never replaced even where a carried wheel's metadata caps it (mistral-common: numpy<2.4): the image's compiled
packages (scipy, pandas, scikit-learn, torch) are built against its numpy, and a downgrade breaks them."""

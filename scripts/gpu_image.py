"""What the GPU machine's image already has: the one place the GPU check reads it from.

Read by hand from that machine's package list (a CUDA image with CPython 3.12, on 2026-11-17;
versions from its ``pip list``). For another GPU machine, put its ``pip list`` in ``PACKAGES``
and ``VERSIONS`` and its date in ``READ_ON``.
``scripts/gpu_wheels.py`` carries, as wheels, every distribution kvstore and the GPU check
need that is not in ``PACKAGES``; ``scripts/gpu_check.py`` reports, on the machine, where a
version seen there misses one of kvstore's requirements.
"""

from __future__ import annotations

import re

READ_ON = "2026-11-17"
SOURCE = "the GPU machine's pip list (a CUDA image, CPython 3.12)"
PYTHON = "3.12"  # python3 there is 3.12.3 (/opt/torch/.venv/bin/python3)
PLATFORM = "manylinux x86_64"

# Versions seen there (its "pip list"); the others are not known here.
VERSIONS = {
    "torch": "2.11.0", "numpy": "2.5.2", "transformers": "5.17.0", "safetensors": "0.8.0",
    "cupy-cuda13x": "14.2.0", "triton": "3.6.0", "tokenizers": "0.23.2",
    "huggingface-hub": "1.33.0",
}

PACKAGES = frozenset({
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal",
    "annotated-doc", "anyio", "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex",
    "click", "cloudpickle", "cmake", "colorama", "contourpy", "coverage", "cuda-bindings",
    "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x", "cycler", "cython", "diffrax",
    "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax",
    "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio",
    "iniconfig", "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib",
    "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader", "lightning",
    "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml", "markdown",
    "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py",
    "mpmath", "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind",
    "narwhals", "networkx", "ninja", "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas",
    "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
    "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
    "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
    "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript",
    "opencv-python-headless", "optax", "opt-einsum", "opt-einsum-fx", "optimistix",
    "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip",
    "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow",
    "pybind11", "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions",
    "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist",
    "python-dateutil", "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu",
    "safetensors", "scikit-build-core", "scikit-image", "scikit-learn", "scipy", "seaborn",
    "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six",
    "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm",
    "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric", "torchmetrics",
    "torchvision", "tqdm", "transformers", "treescope", "triton", "typer", "typing-extensions",
    "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug", "wheel", "wrapt", "xarray",
    "xxhash", "yarl", "zipp",
})


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``PyYAML`` == ``pyyaml``, ``a_b`` ==
    ``a-b``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def has(name: str) -> bool:
    """Whether the image holds distribution ``name`` (any spelling)."""
    return normalize(name) in PACKAGES

"""The SGLang engine's CPU tests: they run in their own virtual environment (``make test-sglang``).

The default run (``pytest`` in ``.venv``, no SGLang) leaves this folder out (``--ignore`` in
``pyproject.toml``'s ``addopts``; naming the folder overrides it); collected anywhere SGLang is
missing, it fails with the line that installs it.

``stubs/`` holds the CPU stand-ins (``sgl_kernel``, the MLA plugin, torchvision, whose PyPI wheels
need CUDA torch); ``make test-sglang`` puts them on ``PYTHONPATH`` and sets SGLang's
CPU engine, and this file does too, for a plain ``pytest tests/sglang``.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("sglang") is None:
    raise pytest.UsageError("tests/sglang needs SGLang in its own virtual environment: run `make test-sglang`")

from tests.sglang.cpu_server import use_cpu_engine

use_cpu_engine()
import torch  # noqa: E402  (after the CPU engine is chosen)

# Once SGLang is imported, torch's intra-op threads contend on this 2-core machine: a tiny
# forward takes ~100x longer with 2 threads than with 1.
torch.set_num_threads(1)

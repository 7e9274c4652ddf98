"""The SGLang engine's CPU tests: collected only where SGLang is importable (``make test-sglang``).

The default run (``pytest`` in ``.venv``, no SGLang) ignores this folder instead of skipping its
tests. ``stubs/`` holds the CPU stand-ins (``sgl_kernel``, the MLA plugin, torchvision, whose
PyPI wheels need CUDA torch); ``make test-sglang`` puts them on ``PYTHONPATH`` and sets SGLang's
CPU engine, and this file does too, for a plain ``pytest tests/sglang``.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["*"]
else:
    from tests.sglang.cpu_server import use_cpu_engine

    use_cpu_engine()
    import torch

    # Once SGLang is imported, torch's intra-op threads contend on this 2-core machine: a tiny
    # forward takes ~100x longer with 2 threads than with 1.
    torch.set_num_threads(1)

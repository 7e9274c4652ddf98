"""The SGLang engine's CPU tests: collected only where SGLang is importable (``make test-sglang``).

The default run (``pytest`` in ``.venv``, no SGLang) ignores this folder instead of skipping its
tests. ``stubs/`` holds a torchvision stand-in (PyPI's wheels need CUDA torch); ``make
test-sglang`` puts it on ``PYTHONPATH`` and this file does too, for a plain ``pytest tests/sglang``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["*"]
else:
    _STUBS = str(Path(__file__).parent / "stubs")
    if _STUBS not in sys.path:
        sys.path.insert(0, _STUBS)
    import torch

    # Once SGLang is imported, torch's intra-op threads contend on this 2-core machine: a tiny
    # forward takes ~100x longer with 2 threads than with 1.
    torch.set_num_threads(1)

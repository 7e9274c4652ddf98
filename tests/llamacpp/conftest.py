"""The llama.cpp engine's tests: collected only where llama-cpp-python is importable (the ``llamacpp`` extra).

``make`` installs the extra (built from source), so CI runs them; a checkout without it ignores
this folder instead of skipping its tests.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("llama_cpp") is None:
    collect_ignore_glob = ["*"]
else:
    import pytest

    @pytest.fixture(scope="session")
    def gguf_dir(tmp_path_factory) -> str:
        """A folder for the GGUF files the tests write."""
        return str(tmp_path_factory.mktemp("gguf"))

    @pytest.fixture(scope="session")
    def tiny1(gguf_dir):
        """The one-layer tiny llama as a float32 GGUF (the exact oracle's model)."""
        from tests.llamacpp.helpers import tiny_gguf

        return tiny_gguf(1, gguf_dir)

    @pytest.fixture(scope="session")
    def tiny2(gguf_dir):
        """The two-layer tiny llama as a float32 GGUF (deeper layers keep their notes)."""
        from tests.llamacpp.helpers import tiny_gguf

        return tiny_gguf(2, gguf_dir)

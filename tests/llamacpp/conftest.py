"""The llama.cpp engine's tests: they need llama-cpp-python (the ``llamacpp`` extra).

``make`` installs the extra (built from source), so CI runs them; where it is missing, collecting
this folder fails with the line that installs it (a test that cannot run says so).
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("llama_cpp") is None:
    raise pytest.UsageError(
        "tests/llamacpp needs llama-cpp-python: `make .venv/.leyline-installed` (or "
        "`pip install -e '.[llamacpp]'`), or leave the folder out with --ignore=tests/llamacpp"
    )


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

"""Shared fixtures: the project's own tokenizer and a chat renderer over it."""

from __future__ import annotations

import os

# Triton kernels run on CPU tensors only if this is set before a kernel is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from leyline_sdk.render.rendering import HFChatTokenizer  # noqa: E402
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def hf_tokenizer():
    """The tiny tokenizer shipped with the SDK, loaded through AutoTokenizer."""
    return load_tiny_tokenizer()


@pytest.fixture(scope="session")
def chat(hf_tokenizer) -> HFChatTokenizer:
    """A ChatTokenizer over the tiny tokenizer."""
    return HFChatTokenizer(hf_tokenizer)


@pytest.fixture(scope="session")
def servers():
    """Real Leyline servers shared by the session: ``servers.get(engine, model)`` (started once)."""
    from tests.conformance.servers import ServerPool

    pool = ServerPool()
    try:
        yield pool
    finally:
        print("\nserver launch times (s):", {k: round(v, 1) for k, v in pool.launch_times().items()})
        pool.close()

"""Shared fixtures: the project's own tokenizer and a chat renderer over it."""

from __future__ import annotations

import pytest

from leyline_sdk.rendering import HFChatTokenizer
from leyline_sdk.tiny_tokenizer import load_tiny_tokenizer


@pytest.fixture(scope="session")
def hf_tokenizer():
    """The tiny tokenizer shipped with the SDK, loaded through AutoTokenizer."""
    return load_tiny_tokenizer()


@pytest.fixture(scope="session")
def chat(hf_tokenizer) -> HFChatTokenizer:
    """A ChatTokenizer over the tiny tokenizer."""
    return HFChatTokenizer(hf_tokenizer)

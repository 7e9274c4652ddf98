"""Leyline SDK: directives, chat rendering, message diffing, edits, and the openai client with sessions.

Two layers, one way:

* the **pure core** — ``directives``, ``wire``, ``rendering``, ``incremental``, ``diff``,
  ``templates``, ``turns``, ``errors``, and the policy contracts ``edits``, ``errata``,
  ``policy``, ``policy_run`` — depends on nothing but pydantic (and a tokenizer where one
  renders). The server and the policy package (``leyline_policies``) import only these;
* the **client** — ``AsyncLeyline`` (an ``openai.AsyncOpenAI``), ``Leyline`` (an
  ``openai.OpenAI``), ``LeylineSession``, ``TurnStats``, ``Blocks`` — is built on openai-python
  and loads on first use (PEP 562), so importing the core never imports openai. The SDK never
  imports ``leyline_policies``: policies are objects handed to a client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leyline_sdk.diff import diff_to_directives
from leyline_sdk.directives import Directive, Mode, apply, check, digest, position_map
from leyline_sdk.incremental import IncrementalRenderer
from leyline_sdk.rendering import ChatTokenizer, HFChatTokenizer, RenderedConversation

if TYPE_CHECKING:
    from leyline_sdk.blocks import Block, Blocks
    from leyline_sdk.client import AsyncLeyline, Leyline
    from leyline_sdk.fallback import SpliceFallbackError
    from leyline_sdk.session import LeylineSession, TurnStats

_LAZY = {
    "AsyncLeyline": "leyline_sdk.client",
    "Leyline": "leyline_sdk.client",
    "LeylineSession": "leyline_sdk.session",
    "TurnStats": "leyline_sdk.session",
    "Block": "leyline_sdk.blocks",
    "Blocks": "leyline_sdk.blocks",
    "SpliceFallbackError": "leyline_sdk.fallback",
}

__all__ = [
    "AsyncLeyline",
    "Leyline",
    "LeylineSession",
    "TurnStats",
    "Block",
    "Blocks",
    "SpliceFallbackError",
    "Directive",
    "Mode",
    "apply",
    "check",
    "digest",
    "position_map",
    "ChatTokenizer",
    "HFChatTokenizer",
    "IncrementalRenderer",
    "RenderedConversation",
    "diff_to_directives",
]


def __getattr__(name: str) -> Any:
    """Load the client-side names on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'leyline_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

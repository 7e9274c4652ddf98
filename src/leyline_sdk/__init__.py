"""Leyline SDK: directives, chat rendering, message diffing, edits, and the openai client with sessions.

Six layers, each importing only the ones above it in this list (``tests/sdk/test_import_graph.py``):

* ``core`` — directives, the wire format, the fallback vocabulary, errors, argument checks;
* ``render`` — chat templates to tokens with exact per-message spans;
* ``explain`` — two renders explained as directives (message diff, alignment, the template's edits);
* ``policy`` — the policy contracts shared with ``leyline_policies``;
* ``session`` — ``LeylineSession`` and its state, over a port to the server (no openai);
* ``client`` — ``AsyncLeyline`` (an ``openai.AsyncOpenAI``), ``Leyline`` (an ``openai.OpenAI``):
  everything that touches openai-python.

The server and ``leyline_policies`` import only the first four. The session and client names
load on first use (PEP 562), so importing the core never imports openai. The SDK never imports
``leyline_policies``: policies are objects handed to a client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leyline_sdk.core.directives import Directive, Mode, apply, check, digest, position_map
from leyline_sdk.core.errors import DirectiveError, ItemError, LeylineError, RenderError
from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.render.incremental import IncrementalRenderer
from leyline_sdk.render.rendering import ChatTokenizer, HFChatTokenizer, RenderedConversation

if TYPE_CHECKING:
    from leyline_sdk.client.client import AsyncLeyline, Leyline
    from leyline_sdk.client.fallback import SpliceFallbackError
    from leyline_sdk.session.blocks import Block, Blocks
    from leyline_sdk.session.session import LeylineSession, TurnStats

_LAZY = {
    "AsyncLeyline": "leyline_sdk.client.client",
    "Leyline": "leyline_sdk.client.client",
    "LeylineSession": "leyline_sdk.session.session",
    "TurnStats": "leyline_sdk.session.session",
    "Block": "leyline_sdk.session.blocks",
    "Blocks": "leyline_sdk.session.blocks",
    "SpliceFallbackError": "leyline_sdk.client.fallback",
}

__all__ = [
    "AsyncLeyline",
    "Leyline",
    "LeylineSession",
    "TurnStats",
    "Block",
    "Blocks",
    "LeylineError",
    "DirectiveError",
    "RenderError",
    "ItemError",
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

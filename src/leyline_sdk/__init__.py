"""Leyline SDK: directives, chat rendering, message diffing, and the async client with sessions.

The pure modules (``directives``, ``rendering``, ``incremental``, ``diff``, ``errors``) load
eagerly and depend on nothing but pydantic; the client side (``AsyncLeyline``, ``Leyline``,
``LeylineSession``, ``TurnStats``, ``Blocks``: httpx, openai and ``leyline_policies``) loads on first use, so
``leyline_policies`` and the server can import ``leyline_sdk.directives`` without pulling the
client in.
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
    from leyline_sdk.session import LeylineSession, TurnStats

_LAZY = {
    "AsyncLeyline": "leyline_sdk.client",
    "Leyline": "leyline_sdk.client",
    "LeylineSession": "leyline_sdk.session",
    "TurnStats": "leyline_sdk.session",
    "Block": "leyline_sdk.blocks",
    "Blocks": "leyline_sdk.blocks",
}

__all__ = [
    "AsyncLeyline",
    "Leyline",
    "LeylineSession",
    "TurnStats",
    "Block",
    "Blocks",
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

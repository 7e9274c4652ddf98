"""Leyline SDK: directives, chat rendering, span diffing, and the async client with sessions."""

from leyline_sdk.client import AsyncLeyline, Leyline
from leyline_sdk.directives import Directive, Mode, apply, check, digest, position_map
from leyline_sdk.rendering import ChatTokenizer, HFChatTokenizer, RenderedConversation
from leyline_sdk.session import LeylineSession, TurnStats
from leyline_sdk.spans import diff_to_directives

__all__ = [
    "AsyncLeyline",
    "Leyline",
    "LeylineSession",
    "TurnStats",
    "Directive",
    "Mode",
    "apply",
    "check",
    "digest",
    "position_map",
    "ChatTokenizer",
    "HFChatTokenizer",
    "RenderedConversation",
    "diff_to_directives",
]

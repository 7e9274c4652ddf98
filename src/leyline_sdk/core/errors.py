"""Exceptions raised by the Leyline SDK on purpose.

HTTP errors are openai-python's own: ``AsyncLeyline`` *is* an ``openai.AsyncOpenAI``, so a
refused request raises ``openai.BadRequestError``, ``openai.NotFoundError``,
``openai.ConflictError`` (409, base mismatch, strict), ``openai.UnprocessableEntityError`` (422,
directive not applicable, strict), ``openai.RateLimitError``, ``openai.InternalServerError``,
... (all ``openai.APIStatusError``), and an unreachable server ``openai.APIConnectionError``.
Leyline adds::

    LeylineError
     ├── DirectiveError (also a ValueError)    directives that cannot apply to a base
     ├── RenderError    (also a ValueError)    a conversation the chat template cannot render
     ├── ItemError      (also a ValueError)    a Responses item or tool that cannot be a chat message
     └── SpliceFallbackError (also an openai.OpenAIError)
                                               strict session: the edit could not be spliced as asked

``SpliceFallbackError`` lives in the client layer (:mod:`leyline_sdk.client.fallback`: it
subclasses openai's base error, so ``except openai.OpenAIError`` catches it) and is importable as
``leyline_sdk.SpliceFallbackError``; this module, used by the server and the policies, does not
import openai. Every one of them is importable from the package root (``from leyline_sdk import
LeylineError``).
"""

from __future__ import annotations

__all__ = ["LeylineError", "DirectiveError", "RenderError", "ItemError"]


class LeylineError(Exception):
    """Base class of every error the SDK raises on purpose (HTTP errors are openai's)."""


class DirectiveError(LeylineError, ValueError):
    """A directive set does not apply to its base.

    ``index`` is the offending directive's position in the list (``None`` when the error is
    about the whole set) and ``field`` the field at fault (``start``, ``end``, ``base_length``).
    """

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


class RenderError(LeylineError, ValueError):
    """The chat template could not render a conversation (bad roles, missing fields, ...)."""


class ItemError(LeylineError, ValueError):
    """A Responses item or tool that cannot be a chat message (``param`` names it, ``code`` says why,
    ``status`` is the HTTP status a server answers with)."""

    def __init__(self, message: str, param: str, code: str = "invalid_request", status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

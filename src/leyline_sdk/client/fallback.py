"""``SpliceFallbackError``: a strict session's edit was not spliced as asked.

It is both a :class:`~leyline_sdk.core.errors.LeylineError` and an ``openai.OpenAIError`` (the root
of openai-python's exceptions), so code that catches openai's errors catches it too. ``code`` is
the fallback code (``base_mismatch``, ``prompt_mismatch``, ``session_not_found``, ...);
``completion`` is the response the server served before reporting the fallback, if any (the
session adopted its base: the next request continues from it).
"""

from __future__ import annotations

from typing import Any

import openai

from leyline_sdk.core.errors import LeylineError

__all__ = ["SpliceFallbackError"]


class SpliceFallbackError(LeylineError, openai.OpenAIError):
    """A strict session's edit was not applied as asked; ``code`` is the fallback code."""

    def __init__(self, code: str, message: str, completion: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.completion = completion

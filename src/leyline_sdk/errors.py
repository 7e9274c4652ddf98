"""Exceptions raised by the Leyline SDK.

Hierarchy::

    LeylineError
     ├── DirectiveError (also a ValueError)   directives that cannot apply to a base
     └── RenderError    (also a ValueError)   a conversation the chat template cannot render
"""

from __future__ import annotations


class LeylineError(Exception):
    """Base class of every error the SDK raises on purpose."""


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

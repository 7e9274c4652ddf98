"""A Leyline client's own arguments (validated once) and how its connection defaults are resolved."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import openai

from leyline_sdk.session.planner import CLIENT_EDITS

__all__ = ["LeylineOptions", "connection"]


@dataclass(frozen=True)
class LeylineOptions:
    """``policies``, ``tokenizer``, ``strict``, ``max_sessions``, ``seam_repair``, ``behind_router``,
    ``routing_header`` (these two: :mod:`leyline_sdk.session.gateway`) and ``client_edits`` (the mode
    of the agent's own history edits: :mod:`leyline_sdk.session.planner`) of a client."""

    policies: tuple[Any, ...] = ()
    tokenizer: Any = None
    strict: bool = False
    max_sessions: int = 256
    seam_repair: int = 4
    behind_router: bool = False
    routing_header: str = "X-SMG-Routing-Key"
    client_edits: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.max_sessions, bool) or not isinstance(self.max_sessions, int) or self.max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {self.max_sessions!r}")
        repair = self.seam_repair
        if isinstance(repair, bool) or not isinstance(repair, int) or repair < 0:
            raise ValueError(f"seam_repair must be an int >= 0, got {repair!r}")
        if not isinstance(self.strict, bool):
            raise TypeError(f"strict must be a bool, got {type(self.strict).__name__}")
        if not isinstance(self.behind_router, bool):
            raise TypeError(f"behind_router must be a bool, got {type(self.behind_router).__name__}")
        if not isinstance(self.routing_header, str) or not self.routing_header.strip():
            raise ValueError(f"routing_header must be a header name, got {self.routing_header!r}")
        if self.client_edits not in CLIENT_EDITS:
            raise ValueError(f"client_edits must be one of {', '.join(CLIENT_EDITS)}, got {self.client_edits!r}")

    @classmethod
    def of(
        cls,
        policies: Sequence[Any],
        tokenizer: Any,
        strict: bool,
        max_sessions: int,
        seam_repair: int,
        behind_router: bool = False,
        routing_header: str = "X-SMG-Routing-Key",
        client_edits: str = "auto",
    ) -> LeylineOptions:
        """Validated options (``ValueError`` / ``TypeError`` naming the argument)."""
        if isinstance(policies, str) or not isinstance(policies, Sequence):
            raise TypeError(f"policies must be a list of policies, got {type(policies).__name__}")
        return cls(
            tuple(policies), tokenizer, strict, max_sessions, seam_repair, behind_router, routing_header, client_edits
        )

    def replace(self, **changes: Any) -> LeylineOptions:
        """These options with ``changes`` (validated again)."""
        if "policies" in changes:
            changes["policies"] = tuple(changes["policies"])
        return dataclasses.replace(self, **changes)

    def as_kwargs(self) -> dict[str, Any]:
        """The constructor arguments that rebuild these options (what ``copy`` passes on)."""
        return {
            "policies": list(self.policies),
            "tokenizer": self.tokenizer,
            "strict": self.strict,
            "max_sessions": self.max_sessions,
            "seam_repair": self.seam_repair,
            "behind_router": self.behind_router,
            "routing_header": self.routing_header,
            "client_edits": self.client_edits,
        }


def connection(base_url: Any, api_key: Any, default_base_url: str) -> tuple[Any, Any]:
    """``(base_url, api_key)`` for openai's constructor, with Leyline's defaults.

    ``base_url``: as given, else ``$OPENAI_BASE_URL``, else ``default_base_url`` (a local server).
    ``api_key``: as given (a string or openai's key provider), else ``$OPENAI_API_KEY``, else
    ``""`` — no key, no ``Authorization`` header.
    """
    if base_url is None or isinstance(base_url, openai.NotGiven):
        base_url = os.environ.get("OPENAI_BASE_URL") or default_base_url
    if api_key is None:
        api_key = os.environ.get("OPENAI_API_KEY") or ""
    return base_url, api_key

"""Policy names for configuration: built-ins plus the ``leyline.policies`` entry-point group."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

__all__ = ["register", "load_policy", "available_policies"]

T = TypeVar("T")
_REGISTRY: dict[str, Callable[..., Any]] = {}
GROUP = "leyline.policies"


def register(name: str) -> Callable[[T], T]:
    """Class or factory decorator: make it loadable as ``load_policy(name)``; returns it unchanged."""

    def decorate(obj: T) -> T:
        _REGISTRY[name] = obj  # type: ignore[assignment]
        return obj

    return decorate


def _builtins() -> dict[str, Callable[..., Any]]:
    from leyline_policies.budget import TokenBudget
    from leyline_policies.chain import Chain
    from leyline_policies.redact import Redact
    from leyline_policies.stale import StaleToolDetector
    from leyline_policies.truncate import TruncateOlderThanN

    return {
        "truncate_older_than_n": TruncateOlderThanN,
        "stale_tool_detector": StaleToolDetector,
        "token_budget": TokenBudget,
        "redact": Redact,
        "chain": Chain,
    }


def available_policies() -> list[str]:
    """Every loadable name (built-in, registered, or from installed entry points)."""
    names = set(_builtins()) | set(_REGISTRY) | {ep.name for ep in entry_points(group=GROUP)}
    return sorted(names)


def load_policy(name: str, **kwargs: Any) -> Any:
    """Build the policy called ``name`` with ``kwargs`` (``KeyError`` listing the known names)."""
    factory = _REGISTRY.get(name) or _builtins().get(name)
    if factory is None:
        matches = [ep for ep in entry_points(group=GROUP) if ep.name == name]
        if not matches:
            raise KeyError(f"unknown policy {name!r}; known: {available_policies()}")
        factory = matches[0].load()
    return factory(**kwargs)

"""Policy names for configuration: built-ins plus the ``leyline.policies`` entry-point group.

Names are snake_case (``truncate_older_than_n``); the kebab-case spelling users write in
configuration (``truncate-older-than-n``) names the same policy everywhere: in
:func:`load_policy`, in :func:`register` and for entry points.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

__all__ = ["register", "load_policy", "available_policies", "canonical_name"]

T = TypeVar("T")
_REGISTRY: dict[str, Callable[..., Any]] = {}
GROUP = "leyline.policies"


def canonical_name(name: str) -> str:
    """The registry's spelling of a policy name: ``stale-tool-detector`` -> ``stale_tool_detector``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a policy name must be a non-empty string, got {name!r}")
    return name.strip().replace("-", "_")


def register(name: str) -> Callable[[T], T]:
    """Class or factory decorator: make it loadable as ``load_policy(name)``; returns it unchanged."""
    key = canonical_name(name)

    def decorate(obj: T) -> T:
        _REGISTRY[key] = obj  # type: ignore[assignment]
        return obj

    return decorate


def _builtins() -> dict[str, Callable[..., Any]]:
    from leyline_policies.budget import TokenBudget
    from leyline_policies.chain import Chain
    from leyline_policies.redact import Redact
    from leyline_policies.stale import StaleToolDetector
    from leyline_policies.thinking import ClearThinking
    from leyline_policies.truncate import TruncateOlderThanN

    return {
        "truncate_older_than_n": TruncateOlderThanN,
        "stale_tool_detector": StaleToolDetector,
        "token_budget": TokenBudget,
        "redact": Redact,
        "chain": Chain,
        "clear_thinking": ClearThinking,
    }


def available_policies() -> list[str]:
    """Every loadable name, canonical (built-in, registered, or from installed entry points)."""
    names = set(_builtins()) | set(_REGISTRY) | {canonical_name(ep.name) for ep in entry_points(group=GROUP)}
    return sorted(names)


def load_policy(name: str, **kwargs: Any) -> Any:
    """Build the policy called ``name`` (snake or kebab case) with ``kwargs``.

    Unknown names raise ``KeyError`` listing the known ones.
    """
    key = canonical_name(name)
    factory = _REGISTRY.get(key) or _builtins().get(key)
    if factory is None:
        matches = [ep for ep in entry_points(group=GROUP) if canonical_name(ep.name) == key]
        if not matches:
            raise KeyError(f"unknown policy {name!r}; known: {available_policies()}")
        factory = matches[0].load()
    return factory(**kwargs)

"""Record the request bodies a wire adapter receives, for the benchmarks that capture a real client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any


@contextlib.contextmanager
def recorded_bodies(inputs: ModuleType) -> Iterator[list[dict[str, Any]]]:
    """Every request body that ``inputs._convert`` (a protocol adapter's conversion: the Responses or
    the Messages API's ``inputs`` module) is handed while inside, as the client sent it."""
    original = inputs._convert
    bodies: list[dict[str, Any]] = []

    def recording(req: Any, *args: Any) -> Any:
        bodies.append(req.model_dump(mode="json", exclude_unset=True))
        return original(req, *args)

    inputs._convert = recording
    try:
        yield bodies
    finally:
        inputs._convert = original

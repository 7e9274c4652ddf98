"""The real agent CLIs against the real server on loopback: all ``slow``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agents.clients import RefusingProxy


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here runs a real CLI against a real server: ``slow`` (CI runs them)."""
    for item in items:
        if "/tests/agents/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def proxy() -> Iterator[RefusingProxy]:
    """Every outbound address but loopback refused (403)."""
    refusing = RefusingProxy()
    try:
        yield refusing
    finally:
        refusing.close()

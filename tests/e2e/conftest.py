"""End-to-end tests start real servers (and processes): all of them are ``slow``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/e2e as slow (``make test-fast`` skips them; CI runs them)."""
    for item in items:
        if "/tests/e2e/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)

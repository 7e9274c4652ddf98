"""Frameworks and openai idioms against the real server (tiny preset, loopback port): all ``slow``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.server_helpers import make_service, running_server

KEY = "sk-frameworks"
MODEL = "tiny-mla"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here starts a real server: ``slow`` (``make test-fast`` skips them; CI runs them)."""
    for item in items:
        if "/tests/frameworks/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The ``/v1`` URL of a real server for the module (API key ``KEY``, model ``MODEL``)."""
    service = make_service(MODEL, kv_budget_mb=32, api_keys=frozenset({KEY}), default_max_tokens=8)
    with running_server(service) as url:
        yield url + "/v1"

"""The attack suite: each of the server's known failure modes as a test, on every CPU engine.

Every test here starts real servers on loopback ports (``slow``). Tests taking ``engine`` run on
the embedded engine and, where llama-cpp-python is installed (``make`` builds it), on llama.cpp:
both serve ``tiny-gqa``, the same weights.
"""

from __future__ import annotations

import importlib.util

import pytest

ENGINES = ["embedded"] + (["llamacpp"] if importlib.util.find_spec("llama_cpp") is not None else [])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every attack test is slow (real servers)."""
    for item in items:
        if "/tests/attack/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The engine a test runs on."""
    return str(request.param)

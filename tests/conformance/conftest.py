"""The conformance suite: the same black-box tests against every engine this venv runs.

``make test`` (main venv) runs them on the embedded and llama.cpp engines, ``make test-sglang``
(SGLang's venv) on SGLang serving on the CPU; see ``servers.py`` for the servers and models.
Each test takes a ``target`` parametrized with :func:`cases` (``engine-model`` ids); the servers
come from the session's :class:`~tests.conformance.servers.ServerPool` (``servers`` fixture in
``tests/conftest.py``), started once.
"""

from __future__ import annotations

import pytest

from tests.conformance.servers import SERVES, Target, available_engines

if "sglang" in available_engines():
    from tests.sglang.cpu_server import use_cpu_engine

    use_cpu_engine()


def cases(*models: str) -> list[object]:
    """``(engine, model)`` parameters for every engine here that serves one of ``models``."""
    return [
        pytest.param((engine, model), id=f"{engine}-{model}", marks=pytest.mark.slow)
        for engine in available_engines()
        for model in models
        if model in SERVES.get(engine, ())
    ]


@pytest.fixture
def target(request: pytest.FixtureRequest, servers) -> Target:
    """The running server of the test's ``(engine, model)`` parameter."""
    engine, model = request.param
    return servers.get(engine, model)

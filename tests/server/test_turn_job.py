"""The turn as one job (``engines/turn_job.py``, what the SGLang engine runs), on the embedded
engine's core, which is a ``SpliceBackend`` as SGLang's is.

Oracle: a fresh prefill of the turn's prompt. A ``forget`` (asked): the turn's logits are the
fresh prefill's, the prefix before the edit reused, the rest computed, no KV approximate. An
``amortize`` splice on a one-layer model (where the δ-rotation is exact) gives the fresh
prefill's logits to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from leyline_sdk.core.directives import Directive, Mode
from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.presets import load_engine
from leyline_server.engines.turn_job import run_turn


@pytest.fixture(scope="module")
def core():
    core, _ = load_engine(EngineConfig(model="tiny-gqa", preset_layers=1, kv_budget_mb=64))
    return core


BASE = [(7 * i + 3) % 200 + 10 for i in range(120)]


def edited(mode: Mode) -> tuple[list[int], SpliceRequest]:
    """Tokens 20–60 of BASE replaced by 5 others, then a question: the prompt and its request."""
    directive = Directive(start=20, end=60, replacement=(11, 12, 13, 14, 15), mode=mode)
    prompt = [*BASE[:20], 11, 12, 13, 14, 15, *BASE[60:], 40, 41, 42]
    return prompt, SpliceRequest([directive], prompt=prompt)


def fresh_logits(core, prompt: list[int]) -> np.ndarray:
    result = core.prefill(prompt, CacheScope(salt="oracle"))
    core.release(result.handle)
    return np.asarray(result.last_logits, dtype=np.float64)


@pytest.mark.parametrize("mode", [Mode.FORGET, Mode.AMORTIZE], ids=str)
def test_a_turn_continues_like_a_fresh_prefill_of_its_prompt(core, mode):
    scope = CacheScope(salt=str(mode), private=f"turn-{mode}")  # the other case's exact KV out of reach
    session = core.prefill(BASE, scope).handle
    prompt, request = edited(mode)
    turn = run_turn(core, prompt, scope, session, request)
    report = turn.report
    assert report is not None and report.applied and not report.deferred, report
    assert turn.handle.tokens[: len(prompt)] == prompt
    np.testing.assert_allclose(np.asarray(turn.last_logits, dtype=np.float64), fresh_logits(core, prompt), atol=1e-3)
    if mode is Mode.FORGET:  # settled after the prefill: the prefix before the edit reused, the rest computed
        assert (report.reused_tokens, report.rotated_tokens, turn.approximate) == (20, 0, 0), report
        assert report.prefilled_tokens == len(BASE) - 40 + 5 - 20, report
    else:
        assert report.rotated_tokens == len(BASE) - 60, report  # moved, not computed
        assert turn.handle.exact == 25 and turn.approximate == len(BASE) - 60, (turn.handle, turn.approximate)
    core.release(turn.handle)

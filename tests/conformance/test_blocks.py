"""A block created once and relocated into a session: exact on a one-layer model, and not recomputed.

One layer: the relocated block continues exactly like a fresh prefill of the conversation that
holds it. A real model (SmolLM2, 30 layers): the block's deeper layers were computed without the
session's context, so the answer must *differ* from a fresh prefill's — a server that silently
recomputed the block would match it. The report says the same: the block's tokens are rotated,
none of them prefilled. An engine that placed the session's rows instead of the block's fails
both (and its canary, which compares with the model's own keys of the block's tokens).
"""

from __future__ import annotations

import pytest

from tests.conformance.client import CONVERSATION, DOC, Client, fresh, gap, user
from tests.conformance.conftest import cases
from tests.conformance.servers import EXACT

BASE = CONVERSATION[:5]
RULES = user("Team rules. " + DOC)
NOTES = 1e-2  # a relocated block's answer on a deep model differs from a fresh prefill's by more


@pytest.mark.parametrize("target", cases("gqa-1", "mla-1", "smollm2"), indirect=True)
def test_a_block_made_once_is_relocated_not_recomputed(target):
    messages = [*BASE[:3], RULES, *BASE[3:], CONVERSATION[5]]
    with Client(target) as c:
        tokens, spans = c.render(messages, prompt=True)
        block = tokens[spans[3][0] : spans[3][1]]
        block_id = c.post("/v1/leyline/blocks", {"tokens": block})["id"]
        oracle = fresh(target, messages)
        sid, base = c.open_session(BASE)
        at = c.render(BASE, prompt=False)[1][3][0]
        place = {"start": at, "end": at, "block": block_id}
        ext = {"session_id": sid, "base": {"length": len(base)}, "directives": [place], "strict": True}
        placed = c.chat(messages, ext)
    report = placed.leyline
    assert report is not None and report["applied"] and report["canary"] == "passed", report
    assert report["rotated_tokens"] == len(block) + len(base) - at, report
    assert report["prefilled_tokens"] == len(tokens) - len(base) - len(block), report  # the question only
    if target.model == "smollm2":
        assert gap(placed, oracle) > NOTES, (placed, oracle)
    else:
        assert gap(placed, oracle) < EXACT, (placed, oracle)

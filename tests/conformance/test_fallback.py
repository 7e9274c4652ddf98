"""A dropped session's next turn falls back (``base_mismatch``) and still gets the full answer."""

from __future__ import annotations

import pytest

from tests.conformance.client import CONVERSATION, Client, fresh, gap, replace, user
from tests.conformance.conftest import cases
from tests.conformance.servers import EXACT

BASE = CONVERSATION[:5]


@pytest.mark.parametrize("target", cases("gqa-1", "mla-1"), indirect=True)
def test_a_dropped_sessions_next_turn_falls_back_with_the_full_answer(target):
    messages = [BASE[0], user("[first report removed]"), *BASE[2:], CONVERSATION[5]]
    with Client(target) as c:
        oracle = fresh(target, messages)
        sid, base = c.open_session(BASE)
        directive = replace(c.render(BASE, prompt=False)[1], c.render(messages, prompt=True), range(1, 2), range(1, 2))
        assert c.http.delete(f"/v1/leyline/sessions/{sid}").json()["deleted"]
        ext = {"session_id": sid, "base": {"length": len(base)}, "directives": [directive]}
        answer = c.chat(messages, ext)
    report = answer.leyline
    assert report is not None and not report["applied"] and report["fallback"]["code"] == "base_mismatch", report
    assert report["session_id"] != sid and report["rotated_tokens"] == 0
    assert len(answer.tokens) == 6 and gap(answer, oracle) < EXACT

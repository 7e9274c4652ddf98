"""Rotated KV is served only to the session that asked: never to a plain request, another session
or another API key — each of those gets exactly a fresh prefill's answer.

On a real model (SmolLM2) the session's spliced answer differs from a fresh prefill's (deeper
layers keep the notes), so an engine that let anyone else match the spliced path would hand them
that different answer. (llama.cpp's SmolLM2 is a Q4_1 GGUF: there "exactly" allows the ~0.08 nats
its kernels already put between a cache hit and a one-pass prefill, see ``servers.py``.)
"""

from __future__ import annotations

import pytest

from tests.conformance.client import CONVERSATION, Client, fresh, gap, replace, user
from tests.conformance.conftest import cases
from tests.conformance.servers import KEYS, exact_tolerance
from tests.conformance.test_blocks import NOTES

BASE = CONVERSATION[:5]


@pytest.mark.parametrize("target", cases("smollm2"), indirect=True)
def test_rotated_kv_is_served_only_to_the_session_that_asked(target):
    messages = [BASE[0], user("[first report removed]"), *BASE[2:], CONVERSATION[5]]
    oracle = fresh(target, messages)
    with Client(target) as a, Client(target, KEYS[1]) as b:
        sid, base = a.open_session(BASE)
        directive = replace(a.render(BASE, prompt=False)[1], a.render(messages, prompt=True), range(1, 2), range(1, 2))
        ext = {"session_id": sid, "base": {"length": len(base)}, "directives": [directive], "strict": True}
        spliced = a.chat(messages, ext)
        assert spliced.leyline is not None and spliced.leyline["applied"], spliced.leyline
        exact = exact_tolerance(target)
        assert gap(spliced, oracle) > max(NOTES, 4 * exact)  # what anyone matching the spliced path would get
        again = a.chat(messages, {"session_id": sid})  # the session itself: its spliced path
        plain = a.chat(messages)
        other_session = a.chat(messages, {})
        other_key = b.chat(messages)
    assert other_session.leyline is not None and other_session.leyline["session_id"] != sid
    for answer in (plain, other_session, other_key):
        assert gap(answer, oracle) < exact, (answer, oracle)
    assert again.leyline is not None and again.leyline["approximate_tokens"] > 0
    assert gap(again, spliced) < exact

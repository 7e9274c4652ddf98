"""On a ONE-layer model an amortize splice continues exactly like a fresh prefill, on every engine.

Layer-0 KV depends only on token and position, so with one layer a spliced cache (kept rows,
prefilled replacement, rotated downstream rows) must give the answer a fresh prefill of the
edited conversation gives: same greedy tokens, same top-5 logprobs to ~1e-5 (float32). A wrong
pair layout, frequency or mscale moves them by whole units; a skipped rotation changes tokens.
"""

from __future__ import annotations

import pytest

from tests.conformance.client import CONVERSATION, DOC, Client, fresh, gap, replace, user
from tests.conformance.conftest import cases
from tests.conformance.servers import EXACT

BASE = CONVERSATION[:5]
QUESTION = CONVERSATION[5]
STUB_A = user("[first report removed]")
STUB_B = user("[second report removed]")

# edit -> (new messages before the question, [(base messages, their new messages)])
EDITS = {
    "one-directive": ([BASE[0], STUB_A, *BASE[2:]], [(range(1, 2), range(1, 2))]),
    "two-directives": (
        [BASE[0], STUB_A, BASE[2], STUB_B, BASE[4]],
        [(range(1, 2), range(1, 2)), (range(3, 4), range(3, 4))],
    ),
    "deletion": ([BASE[0], *BASE[3:]], [(range(1, 3), range(1, 1))]),
    "insertion": ([*BASE[:3], user("Also keep in mind: " + DOC), *BASE[3:]], [(range(3, 3), range(3, 4))]),
}


@pytest.mark.parametrize("target", cases("gqa-1", "mla-1"), indirect=True)
@pytest.mark.parametrize("edit", list(EDITS))
def test_amortize_splice_continues_exactly_like_a_fresh_prefill(target, edit):
    edited, changes = EDITS[edit]
    messages = [*edited, QUESTION]
    with Client(target) as c:
        oracle = fresh(target, messages)
        sid, base = c.open_session(BASE)
        base_spans = c.render(BASE, prompt=False)[1]
        new = c.render(messages, prompt=True)
        directives = [replace(base_spans, new, old, now) for old, now in changes]
        ext = {"session_id": sid, "base": {"length": len(base)}, "directives": directives, "strict": True}
        spliced = c.chat(messages, ext)
    report = spliced.leyline
    assert report is not None and report["applied"] and report["fallback"] is None, report
    kept_after = len(base) - directives[0]["start"] - sum(d["end"] - d["start"] for d in directives)
    assert report["canary"] == "passed" and report["rotated_tokens"] == kept_after > 0, report
    assert gap(spliced, oracle) < EXACT, (spliced, oracle)


@pytest.mark.parametrize("target", cases("gqa-1", "mla-1"), indirect=True)
def test_the_next_turn_is_served_from_the_spliced_path_and_stays_exact(target):
    # a stub no other test sends: no exact copy of this conversation is cached anywhere
    messages = [BASE[0], user("[the first report was removed before this turn]"), *BASE[2:], QUESTION]
    changes = [(range(1, 2), range(1, 2))]
    with Client(target) as c:
        sid, base = c.open_session(BASE)
        directives = [replace(c.render(BASE, prompt=False)[1], c.render(messages, prompt=True), *changes[0])]
        first = c.chat(messages, {"session_id": sid, "base": {"length": len(base)}, "directives": directives})
        assert first.leyline is not None and first.leyline["applied"], first.leyline
        follow = [*messages, {"role": "assistant", "content": first.text}, user("And what did the other one say?")]
        after = c.chat(follow, {"session_id": sid})
        oracle = fresh(target, follow)
        spliced_prompt = len(c.render(messages, prompt=True)[0])
    report = after.leyline
    assert report is not None and report["fallback"] is None and report["session_id"] == sid, report
    assert report["reused_tokens"] >= spliced_prompt and report["approximate_tokens"] > 0, report
    assert gap(after, oracle) < EXACT

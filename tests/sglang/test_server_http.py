"""``leyline-server --engine sglang`` served for real on the CPU, driven over HTTP.

The servers are subprocesses started once per test session (``servers`` in ``tests/conftest.py``;
``tests/sglang/cpu_server.py`` says what SGLang needs on a CPU): a one-layer GQA model and a
one-layer MLA model with YaRN made from the tiny presets, and SmolLM2-135M-Instruct. Everything
between the HTTP request and the KV pool is production code: Leyline's service, the SGLang engine
and its plugin in SGLang's scheduler, SGLang's tokenizer manager, batches, radix cache, pools
and model forward (torch-native layers). The conformance suite (``tests/conformance``) runs on
the same servers; this file adds what is SGLang's own or needs a real model.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
from tests.conformance.client import CONVERSATION, Client, gap, replace, user
from tests.conformance.servers import EXACT, KEYS, SGLANG_POOL

pytestmark = pytest.mark.slow
BASE = CONVERSATION[:5]
EDITED = [BASE[0], user("[first report removed]"), *BASE[2:], CONVERSATION[5]]


@pytest.fixture
def target(request: pytest.FixtureRequest, servers):
    """The SGLang server of the test's model parameter."""
    return servers.get("sglang", request.param)


def _session_and_directive(c: Client) -> tuple[str, list[int], dict]:
    sid, base = c.open_session(BASE)
    directive = replace(c.render(BASE, prompt=False)[1], c.render(EDITED, prompt=True), range(1, 2), range(1, 2))
    return sid, base, directive


# -- chat -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["gqa-1", "mla-1", "smollm2"], indirect=True)
def test_chat_streamed_and_not_with_the_openai_client(target):
    client = openai.OpenAI(base_url=target.url + "/v1", api_key=KEYS[0], max_retries=0)
    messages = [user("Name three colours of the rainbow.")]
    whole = client.chat.completions.create(model=target.name, messages=messages, max_tokens=8, temperature=0)
    assert whole.choices[0].finish_reason in ("length", "stop") and whole.usage.completion_tokens <= 8
    prompt = httpx.post(
        target.url + "/v1/leyline/tokenize", json={"messages": messages}, headers={"Authorization": f"Bearer {KEYS[0]}"}
    ).json()["tokens"]
    assert whole.usage.prompt_tokens == len(prompt)
    chunks = list(
        client.chat.completions.create(
            model=target.name, messages=messages, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    client.close()


@pytest.mark.parametrize("target", ["smollm2"], indirect=True)
def test_smollm2_greedy_tokens_equal_transformers_own_forward(target):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.sglang.cpu_server import checkpoint

    messages = [user("What is the capital of France? Answer in one word.")]
    with Client(target) as c:
        prompt, _ = c.render(messages, prompt=True)
        r = c.post("/v1/chat/completions", {"model": target.name, "messages": messages, "max_tokens": 8,
                                             "temperature": 0, "leyline": {}})  # fmt: skip
        c.sessions.add(r["leyline"]["session_id"])
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint("smollm2-135m")), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    expected = out[0, len(prompt) :].tolist()
    got = r["leyline"]["completion_token_ids"]
    assert got == expected[: len(got)] and len(got) >= 1


# -- sessions and splices ------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["gqa-1", "mla-1"], indirect=True)
async def test_sdk_agent_session_splices_with_the_canary_passing(target):
    client = AsyncLeyline(base_url=target.url + "/v1", api_key=KEYS[0], policies=[TruncateOlderThanN(2)])
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    reports = []
    for turn in range(6):
        r = await session.create(model=target.name, messages=messages, max_tokens=2)
        reports.append(r.leyline)
        messages += agent_turn(turn, lines=8)
    await client.aclose()
    with Client(target) as c:  # aclose deleted the session: the shared server has its KV back
        assert c.http.get(f"/v1/leyline/sessions/{reports[-1]['session_id']}").status_code == 404
    edited = [(s, rep) for s, rep in zip(session.stats, reports, strict=True) if s.directives]
    assert all(s.fallback is None and rep["applied"] for s, rep in edited), session.stats
    moved = [(s, rep) for s, rep in edited if s.rotated_tokens]
    assert len(moved) >= 2, session.stats
    for stats, report in moved:  # old tool outputs truncated: the turns after them rotated, not recomputed
        assert report["canary"] == "passed" and stats.prefilled_tokens < stats.prompt_tokens // 2, stats


@pytest.mark.parametrize("target", ["gqa-1", "mla-1"], indirect=True)
def test_forget_recomputes_from_the_span_like_a_fresh_prefill(target):
    with Client(target) as c:
        fresh = c.chat(EDITED)
        sid, base, directive = _session_and_directive(c)
        ext = {"session_id": sid, "base": {"length": len(base)}, "directives": [{**directive, "mode": "forget"}]}
        forgot = c.chat(EDITED, ext)
        tokens, _ = c.render(EDITED, prompt=True)
    report = forgot.leyline
    assert report["applied"] and report["rotated_tokens"] == 0 and report["reused_tokens"] >= directive["start"]
    assert report["prefilled_tokens"] == len(tokens) - report["reused_tokens"]  # everything after the edit
    assert report["reused_tokens"] - directive["start"] < 4  # the stub's opening tokens equal the old message's
    assert gap(forgot, fresh) < EXACT


FALLBACKS = {  # code -> (change to the request, HTTP status when strict)
    "base_mismatch": (lambda ext, base: {**ext, "base": {"length": len(base) + 1}}, 409),
    "span_invalid": (lambda ext, base: {**ext, "directives": [*ext["directives"], {"start": 3, "end": 40}]}, 422),
    "token_invalid": (
        lambda ext, base: {**ext, "directives": [{**ext["directives"][0], "replacement": [10**6]}]},
        422,
    ),
    "prompt_mismatch": (
        lambda ext, base: {**ext, "directives": [{**ext["directives"][0], "replacement": [11, 12, 13]}]},
        422,
    ),
}


@pytest.mark.parametrize("target", ["gqa-1"], indirect=True)
@pytest.mark.parametrize("code", list(FALLBACKS))
def test_each_fallback_code_over_http_serves_the_full_answer_or_refuses_when_strict(target, code):
    change, status = FALLBACKS[code]
    with Client(target) as c:
        fresh = c.chat(EDITED)
        sid, base, directive = _session_and_directive(c)
        ext = change({"session_id": sid, "base": {"length": len(base)}, "directives": [directive]}, base)
        r = c.http.post(
            "/v1/chat/completions",
            json={"model": target.name, "messages": EDITED, "max_tokens": 6, "temperature": 0,
                  "leyline": {**ext, "strict": True}},
        )  # fmt: skip
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert c.http.get(f"/v1/leyline/sessions/{sid}").json()["tokens"] == base  # strict: nothing changed
        answer = c.chat(EDITED, ext)
    assert not answer.leyline["applied"] and answer.leyline["fallback"]["code"] == code, answer.leyline
    assert gap(answer, fresh) < EXACT  # the full answer, served as a forget of the prompt


@pytest.mark.parametrize("target", ["gqa-1"], indirect=True)
def test_drift_budget_refuses_the_65th_rotation_of_a_row(target):
    with Client(target) as c:
        sid, base = c.open_session(BASE)
        tokens = list(base)
        for i in range(65):  # one more token at 5 each time: the tail moves, and never to a sequence seen before
            d = {"start": 5, "end": 5, "replacement": [42]}
            r = c.post(f"/v1/leyline/sessions/{sid}/directives", {"directives": [d], "base": {"length": len(tokens)}})
            moved = len(tokens) - 5
            tokens = tokens[:5] + [42] + tokens[5:]
            if i < 64:
                assert r["applied"] and r["rotated_tokens"] == moved, r
        assert not r["applied"] and r["fallback"]["code"] == "drift_budget", r
        assert c.http.get(f"/v1/leyline/sessions/{sid}").json()["tokens"] == tokens  # served as a forget


@pytest.mark.parametrize("target", ["mla-1"], indirect=True)
def test_capacity_falls_back_to_forget_when_the_splice_cannot_fit(target):
    log = [user("Please keep this log. " + " ".join(f"entry {i} ok." for i in range(300)))]
    edited = [user("[log dropped]"), *log[1:]]
    with Client(target) as c:
        sid, base = c.open_session(log)
        assert 2 * len(base) > SGLANG_POOL["mla-1"] > len(base), len(base)  # the old copy and the new do not fit
        d = {"start": 1, "end": 2, "replacement": c.render(edited, prompt=False)[0][1:2]}
        answer = c.chat(log, {"session_id": sid, "base": {"length": len(base)}, "directives": [d]}, max_tokens=2)
    assert not answer.leyline["applied"] and answer.leyline["fallback"]["code"] == "capacity", answer.leyline
    assert len(answer.tokens) == 2  # served as a forget


# -- clients that leave, requests that overlap ---------------------------------------------------
@pytest.mark.parametrize("target", ["smollm2"], indirect=True)
def test_a_client_that_disconnects_mid_stream_stops_the_generation(target):
    story = [user("Tell me a long story about a lighthouse keeper.")]
    with Client(target) as c:
        sid, base = c.open_session(story)
        body = {"model": target.name, "messages": story, "max_tokens": 400, "temperature": 0, "stream": True,
                "leyline": {"session_id": sid}}  # fmt: skip
        started = time.monotonic()
        with c.http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            seen = [next(lines) for _ in range(6)]  # a few chunks, then hang up
        assert any(line.startswith("data: {") for line in seen)
        # the session is busy until SGLang has aborted the request: the next turn waits for that
        after = c.chat(story, {"session_id": sid}, max_tokens=2)
        elapsed = time.monotonic() - started
        kept = c.http.get(f"/v1/leyline/sessions/{sid}").json()["tokens"]
    assert after.leyline is not None and after.leyline["session_id"] == sid and len(after.tokens) == 2
    assert elapsed < 30  # 400 tokens take ~45 s at ~9 tokens/s: the generation stopped when the client left
    assert len(kept) < len(base) + 100


@pytest.mark.parametrize("target", ["smollm2"], indirect=True)
def test_requests_during_a_splice_are_served_and_the_sessions_next_turn_waits_for_it(target):
    note = user("Background notes. " + " ".join(f"Note {i}: the pump at site {i} was serviced." for i in range(120)))
    question = [user("Say hello.")]
    grown = [*BASE[:3], note, *BASE[3:]]
    with Client(target) as c, Client(target) as other:
        fresh = other.chat(question, max_tokens=4)
        sid, base = c.open_session(BASE)
        new = c.render(grown, prompt=False)
        d = replace(c.render(BASE, prompt=False)[1], new, range(3, 3), range(3, 4))
        assert len(d["replacement"]) > 600  # a prefill of seconds on this CPU
        result: dict = {}

        def splice() -> None:
            result["report"] = c.post(f"/v1/leyline/sessions/{sid}/directives", {"directives": [d]})
            result["done"] = time.monotonic()

        worker = threading.Thread(target=splice)
        worker.start()
        time.sleep(0.5)
        sent = time.monotonic()
        during = other.chat(question, max_tokens=4)
        with Client(target) as same:
            turn = same.chat([*grown, CONVERSATION[5]], {"session_id": sid}, max_tokens=2)
        worker.join(timeout=300)
    assert result["report"]["applied"] and result["report"]["canary"] == "passed", result
    assert sent < result["done"]  # the plain request went in while the splice ran
    assert gap(during, fresh) < EXACT
    spliced_length = len(new[0])
    assert turn.leyline["reused_tokens"] >= spliced_length and turn.leyline["approximate_tokens"] > 0, turn.leyline

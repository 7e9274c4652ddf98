"""Auto-splice matches a conversation, not a key (finding 4).

Two plain clients on one key: A's prompt holds a PIN, B's is the same conversation with the PIN
masked. B must never be served from A's session (A's KV, rotated or not, was computed over the
PIN): B's logprobs equal those of a fresh server that never saw A.
"""

from __future__ import annotations

import openai

from tests.attack.helpers import KEYS, MODEL, serve, service

SYSTEM = {"role": "system", "content": "You are the assistant of a bank. Answer briefly."}
STATEMENT = "Statement:\n" + "\n".join(
    f"{i:02d} transfer {i * 37 % 1000} EUR to account {i * 7919 % 10000}" for i in range(30)
)


def conversation(pin: str) -> list[dict]:
    return [
        SYSTEM,
        {"role": "user", "content": f"My PIN is {pin}. Remember it for later."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": STATEMENT},
        {"role": "user", "content": "Which transfer is the largest?"},
    ]


async def _ask(url: str, key: str, messages: list[dict]):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    return await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=5
    )


def _logprobs(response) -> list[list[tuple[str, float]]]:
    return [[(t.token, t.logprob) for t in entry.top_logprobs] for entry in response.choices[0].logprobs.content]


async def test_a_plain_client_never_gets_another_conversations_session(engine):
    svc = service(engine, auto_splice=True, api_keys=frozenset(KEYS))
    with serve(svc) as url:
        a = await _ask(url, "key-a", conversation("4921"))
        b = await _ask(url, "key-a", conversation("####"))
        # A's own next turn still continues A's session
        a2 = await _ask(url, "key-a", [*conversation("4921"), {"role": "assistant", "content": "x"}, SYSTEM])
    with serve(service(engine, auto_splice=True, api_keys=frozenset(KEYS))) as url:
        fresh = await _ask(url, "key-a", conversation("####"))
    assert b.leyline["session_id"] != a.leyline["session_id"]
    assert b.leyline["approximate_tokens"] == 0 and b.leyline["rotated_tokens"] == 0 and not b.leyline["auto_splice"]
    assert b.usage.prompt_tokens_details.cached_tokens > 0  # the exact shared prefix is still reused
    assert b.leyline["completion_token_ids"] == fresh.leyline["completion_token_ids"]
    for mine, theirs in zip(_logprobs(b), _logprobs(fresh), strict=True):
        assert [t for t, _ in mine] == [t for t, _ in theirs]
        assert max(abs(x - y) for (_, x), (_, y) in zip(mine, theirs, strict=True)) < 1e-4, (mine, theirs)
    assert a2.leyline["session_id"] == a.leyline["session_id"]

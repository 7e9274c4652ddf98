"""Round three, finding 2: every client-supplied byte the server keeps is bounded in bytes.

Before: junk in an ignored input-item field, ``metadata`` or ``user`` was stored verbatim with each
response (30 × 7 MB: +245 MB RSS, bounded only by count and tokens: ~13 tokens each), and
``user``, ``safety_identifier``, ``prompt_cache_key`` and ``metadata.user_id`` were kept in each
session's state even with ``store: false`` (20 × 7 MB: +189 MB until the sessions were deleted).

Now stored responses are bounded per key in bytes too (``--max-response-mb-per-key``), least
recently used first out, and a session keeps a digest of each hint, never the client's bytes —
while the hints still tell conversations apart.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx

from tests.attack.helpers import KEYS, MODEL, auth, serve, service

MIB = 2**20


def create(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, "max_output_tokens": 2, "temperature": 0, **fields}


async def test_stored_responses_are_bounded_in_bytes_per_key(engine):
    svc = service(engine, api_keys=frozenset(KEYS), responses_bytes_per_key=4 * MIB, max_body_bytes=16 * MIB)
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            a, b = auth(KEYS[0]), auth(KEYS[1])
            theirs = await c.post("/v1/responses", json=create("hello"), headers=b)
            junk = "j" * MIB
            ids = []
            for i in range(6):  # 1 MiB each in an ignored field, in metadata and in user: 3 MiB a response
                item = {"type": "message", "role": "user", "content": f"turn {i}", "junk": junk}
                body = create("", input=[item], metadata={"m": junk[:512]}, user=junk)
                r = await c.post("/v1/responses", json=body, headers=a)
                assert r.status_code == 200, r.text
                ids.append(r.json()["id"])
            kept = [rid for rid in ids if (await c.get(f"/v1/responses/{rid}", headers=a)).status_code == 200]
            assert kept == ids[-1:], kept  # 3 MiB each within 4 MiB: the newest alone
            items = (await c.get(f"/v1/responses/{ids[-1]}/input_items", headers=a)).json()["data"]
            assert items[0]["junk"] == junk  # what is kept is kept whole
            assert (await c.get(f"/v1/responses/{theirs.json()['id']}", headers=b)).status_code == 200


def _hint_sizes(svc: Any) -> list[int]:
    """The length of every hint value any session keeps."""
    return [len(v) for s in svc.sessions.all() if s.auto is not None for v in s.auto.hints.values()]


async def test_sessions_keep_no_client_hint_bytes(engine):
    svc = service(engine, max_body_bytes=16 * MIB)
    big = "u" * MIB
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            hints = {"user": big, "safety_identifier": big + "s", "prompt_cache_key": big + "k"}
            first = await c.post("/v1/responses", json=create("Say one word.", store=False, **hints))
            assert first.status_code == 200, first.text
            reply = first.json()["output"]
            more = [{"type": "message", "role": "user", "content": "Say one word."}, *reply]
            more.append({"type": "message", "role": "user", "content": "Another."})
            other = await c.post("/v1/responses", json=create("", input=more, store=False, **{**hints, "user": "x"}))
            same = await c.post("/v1/responses", json=create("", input=more, store=False, **hints))
        async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0) as claude:
            await claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                                         metadata={"user_id": big})  # fmt: skip
        sizes = _hint_sizes(svc)  # while the server runs: its sessions' state
    session = first.headers["x-leyline-session"]
    assert same.headers["x-leyline-session"] == session  # the same hints: the same conversation
    assert other.headers["x-leyline-session"] != session  # another user's: never its session
    assert len(sizes) >= 7 and max(sizes) <= 64, sizes

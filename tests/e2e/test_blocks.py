"""Blocks over HTTP: created once, private to their key, placed by a directive, unknown ids fall back."""

from __future__ import annotations

import httpx

from leyline_sdk.core.directives import digest
from tests.e2e.server_helpers import make_service, running_server

KEY_A, KEY_B = "sk-alpha", "sk-beta"
DOC = [(53 * i + 5) % 1000 + 7 for i in range(40)]


def http(url, key):
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


async def test_blocks_are_private_placed_and_fall_back_when_unknown():
    with running_server(make_service(api_keys=frozenset({KEY_A, KEY_B}))) as url:
        async with http(url, KEY_A) as a, http(url, KEY_B) as b:
            block = (await a.post("/v1/leyline/blocks", json={"tokens": DOC})).json()
            assert block["object"] == "leyline.block" and block["length"] == 40 and block["id"].startswith("blk_")
            assert (await a.get(f"/v1/leyline/blocks/{block['id']}")).json()["tokens"] == DOC
            assert (await b.get(f"/v1/leyline/blocks/{block['id']}")).status_code == 404
            assert (await b.delete(f"/v1/leyline/blocks/{block['id']}")).status_code == 404
            base = list(range(10, 50))
            sid = (await a.post("/v1/leyline/sessions", json={"tokens": base})).json()["id"]
            place = {"start": 40, "end": 40, "block": block["id"]}
            r = (await a.post(f"/v1/leyline/sessions/{sid}/directives", json={"directives": [place]})).json()
            assert r["applied"] and r["rotated_tokens"] == 40 and r["prefilled_tokens"] == 0
            assert r["base"] == {"length": 80, "digest": digest(base + DOC)}
            # key B cannot use A's block: reported, and the directive is not applied
            sid_b = (await b.post("/v1/leyline/sessions", json={"tokens": base})).json()["id"]
            r = (await b.post(f"/v1/leyline/sessions/{sid_b}/directives", json={"directives": [place]})).json()
            assert (
                not r["applied"] and r["fallback"]["code"] == "span_invalid" and block["id"] in r["fallback"]["message"]
            )
            made = (await a.post("/v1/leyline/blocks", json={"messages": [{"role": "user", "content": "doc"}]})).json()
            rendered = await a.post("/v1/leyline/tokenize", json={"messages": [{"role": "user", "content": "doc"}]})
            span = rendered.json()["message_spans"][0]
            assert made["tokens"] == rendered.json()["tokens"][span["start"] : span["end"]]
            assert (await a.delete(f"/v1/leyline/blocks/{block['id']}")).json()["deleted"]
            assert (await a.get(f"/v1/leyline/blocks/{block['id']}")).status_code == 404

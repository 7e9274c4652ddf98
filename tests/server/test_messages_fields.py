"""Every Messages API field has a stated treatment, the anthropic SDK's create parameters are all
known, the docs list them, and a refused or unknown field is a 400 naming it, in Anthropic's shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from leyline_server.api.messages_api.schemas import FIELDS, MessagesRequest
from tests.e2e.server_helpers import make_service

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_covers_exactly_the_accepted_fields():
    assert set(FIELDS) == set(MessagesRequest.model_fields)


def test_anthropics_create_params_are_all_known():
    from anthropic.types import message_create_params as p
    from anthropic.types.beta import message_create_params as beta

    sent = set(p.MessageCreateParamsBase.__annotations__) | set(beta.MessageCreateParamsBase.__annotations__)
    sent -= {"betas"}  # the SDK sends these as the anthropic-beta header
    sent |= {"stream", "temperature", "top_p", "top_k"}  # older SDKs and Claude Code still send these
    assert sent <= set(FIELDS), sent - set(FIELDS)


def test_the_docs_list_every_field_with_its_treatment():
    text = (ROOT / "docs/messages.md").read_text()
    missing = [name for name, rule in FIELDS.items() if f"| `{name}` | {rule.treatment} |" not in text]
    assert not missing, f"docs/messages.md does not list {missing}"


@pytest.fixture(scope="module")
def http():
    from leyline_server.api.app import create_app

    with TestClient(create_app(make_service("tiny-mla", kv_budget_mb=16))) as client:
        yield client


BODY = {"model": "tiny-mla", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("field", "value"), [("container", "c"), ("mcp_servers", [{"type": "url"}]), ("compaction", {}), ("nope", 1)]
)
def test_a_refused_or_unknown_field_is_a_400_naming_it(http, field, value):
    got = http.post("/v1/messages?beta=true", json={**BODY, field: value})
    assert got.status_code == 400, got.text
    body = got.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert field in body["error"]["message"]


def test_no_ops_are_accepted(http):
    extra = {"service_tier": "auto", "cache_control": {"type": "ephemeral"}, "inference_geo": "us", "speed": "fast"}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "context-1m-2025-08-07"}
    got = http.post("/v1/messages", json={**BODY, **extra}, headers=headers)
    assert got.status_code == 200, got.text
    assert got.json()["type"] == "message"

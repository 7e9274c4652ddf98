"""Every Responses API field has a stated treatment, openai's create params are all known, the docs
list them, and a refused or unknown field is a 400 naming it (against the real app, in process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from leyline_server.api.responses_api.schemas import FIELDS, ResponsesRequest
from tests.e2e.server_helpers import make_service

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_covers_exactly_the_accepted_fields():
    assert set(FIELDS) == set(ResponsesRequest.model_fields)


def test_openais_create_params_are_all_known():
    from openai.types.responses import response_create_params as p

    openai_fields = set(p.ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert openai_fields - {"leyline"} <= set(FIELDS), openai_fields - set(FIELDS)


def test_the_docs_list_every_field_with_its_treatment():
    text = (ROOT / "docs/responses.md").read_text()
    missing = [name for name, rule in FIELDS.items() if f"| `{name}` | {rule.treatment} |" not in text]
    assert not missing, f"docs/responses.md does not list {missing}"


@pytest.fixture(scope="module")
def http():
    from leyline_server.api.app import create_app

    with TestClient(create_app(make_service("tiny-mla", kv_budget_mb=16))) as client:
        yield client


@pytest.mark.parametrize(
    ("field", "value"),
    [("background", True), ("conversation", "conv_1"), ("context_management", [{"type": "compaction"}]),
     ("prompt", {"id": "pmpt_1"}), ("no_such_field", 1)],
)  # fmt: skip
def test_a_refused_or_unknown_field_is_a_400_naming_it(http, field, value):
    got = http.post("/v1/responses", json={"model": "tiny-mla", "input": "hi", field: value})
    assert got.status_code == 400, got.text
    assert field in got.text


def test_a_refused_field_at_its_default_is_accepted(http):
    got = http.post("/v1/responses", json={"model": "tiny-mla", "input": "hi", "background": False,
                                           "max_output_tokens": 2})  # fmt: skip
    assert got.status_code == 200, got.text
    assert got.json()["object"] == "response"

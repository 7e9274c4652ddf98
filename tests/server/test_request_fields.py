"""Every request field has a stated treatment, the docs list it, and the pure translations are right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leyline_server.api.errors import APIError
from leyline_server.api.fields import FIELDS
from leyline_server.api.params import template_kwargs
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.contract.values import Constraint, SamplingParams
from leyline_server.engines.sglang.sampling import constraint_args, sampling_dict

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_covers_exactly_the_accepted_fields():
    assert set(FIELDS) == set(ChatCompletionRequest.model_fields)


def test_openai_and_sglang_fields_are_all_known():
    from openai.types.chat import completion_create_params as p

    openai_fields = set(p.CompletionCreateParamsBase.__annotations__)
    assert openai_fields <= set(FIELDS)


@pytest.mark.parametrize("doc", ["docs/design.md", "docs/server.md"])
def test_the_docs_list_every_field(doc):
    text = (ROOT / doc).read_text()
    missing = [name for name in FIELDS if f"`{name}`" not in text]
    assert not missing, f"{doc} does not mention {missing}"


def request(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **kw)


def test_template_kwargs_must_be_read_by_the_template():
    template = "{% if enable_thinking %}<think>{% endif %}{{ messages }}"
    assert template_kwargs(request(chat_template_kwargs={"enable_thinking": True}), template) == {
        "enable_thinking": True
    }
    for bad in ({"nothing_reads_this": 1}, {"add_generation_prompt": False}):
        with pytest.raises(APIError) as err:
            template_kwargs(request(chat_template_kwargs=bad), template)
        assert err.value.param == f"chat_template_kwargs.{next(iter(bad))}"
    assert template_kwargs(request(reasoning_effort="none"), template)["enable_thinking"] is False
    with pytest.raises(APIError) as err:
        template_kwargs(request(reasoning_effort="high"), "{{ messages }}")
    assert err.value.param == "reasoning_effort"


def test_template_kwargs_reach_the_template(hf_tokenizer):
    import copy

    from leyline_sdk.render.rendering import HFChatTokenizer

    tok = copy.deepcopy(hf_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ greeting | default('hi') }} {{ m['content'] }}\n{% endfor %}"
    chat = HFChatTokenizer(tok)
    plain = chat.render_text([{"role": "user", "content": "x"}], None, False)
    custom = chat.with_template_kwargs({"greeting": "hello"}).render_text(
        [{"role": "user", "content": "x"}], None, False
    )
    assert (plain, custom) == ("hi x\n", "hello x\n")
    assert chat.render_text([{"role": "user", "content": "x"}], None, False) == plain  # the original is untouched


def test_the_sglang_engine_gets_sglangs_own_parameters():
    schema = json.dumps({"type": "object"})
    for kind in ("json_schema", "regex", "ebnf", "structural_tag"):
        assert constraint_args(Constraint(kind=kind, value=schema)) == {kind: schema}
    params = SamplingParams(
        max_tokens=5,
        top_k=4,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=2,
        ignore_eos=True,
        constraint=Constraint(kind="regex", value="[ab]+"),
    )
    out = sampling_dict(params)
    assert {k: out[k] for k in ("top_k", "min_p", "repetition_penalty", "min_new_tokens", "ignore_eos", "regex")} == {
        "top_k": 4,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "min_new_tokens": 2,
        "ignore_eos": True,
        "regex": "[ab]+",
    }
    plain = sampling_dict(SamplingParams(max_tokens=5))
    assert not {"top_k", "min_p", "repetition_penalty", "min_new_tokens", "ignore_eos", "json_schema"} & set(plain)

"""Sampling fields a request leaves unset take the model's own defaults (a real preset's upstream values)."""

from __future__ import annotations

import argparse

import openai
import pytest

from leyline_server.api.config import ServerConfig
from leyline_server.api.params import sampling_params
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.cli import sampling_defaults
from leyline_server.models import QWEN_SAMPLING
from tests.e2e.server_helpers import make_service, running_server

USER = [{"role": "user", "content": "hi"}]


def params(defaults=None, **fields):
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})
    return sampling_params(req, 10, 100, 1000, defaults=defaults)


def test_unset_fields_take_the_defaults_and_set_ones_win():
    qwen = dict(QWEN_SAMPLING)
    p = params(qwen)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.7, 0.8, 20, 1.1)
    p = params(qwen, temperature=0, top_p=1.0, top_k=-1, repetition_penalty=1.0)  # a client's explicit values
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0, 1.0, 0, 1.0)
    p = params(None)  # OpenAI's own defaults
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.min_p) == (1.0, 1.0, 0, 1.0, 0.0)


def test_a_real_preset_brings_its_upstream_defaults():
    assert ServerConfig(model_name="qwen2.5-coder-1.5b").sampling == dict(QWEN_SAMPLING)
    assert ServerConfig(model_name="qwen2.5-coder-0.5b-instruct").sampling == dict(QWEN_SAMPLING)
    assert ServerConfig(model_name="tiny-gqa").sampling == {}
    assert ServerConfig(model_name="qwen2.5-coder-1.5b", sampling_defaults={}).sampling == {}
    assert ServerConfig(model_name="tiny-gqa", sampling_defaults={"top_k": 5}).sampling == {"top_k": 5}


def test_the_flag_takes_model_openai_or_json():
    assert sampling_defaults("model") is None
    assert sampling_defaults("openai") == {}
    assert sampling_defaults('{"temperature": 0, "top_k": 20}') == {"temperature": 0.0, "top_k": 20.0}
    for bad in ('{"temprature": 1}', "[1]", '{"temperature": "hot"}', "warm"):
        with pytest.raises(argparse.ArgumentTypeError):
            sampling_defaults(bad)


def test_a_server_whose_default_is_greedy_answers_as_an_explicit_greedy_request():
    service = make_service("tiny-gqa", sampling_defaults={"temperature": 0.0}, default_max_tokens=12)
    with running_server(service) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        greedy = client.chat.completions.create(model="tiny-gqa", messages=USER, temperature=0, seed=1)
        unset = [client.chat.completions.create(model="tiny-gqa", messages=USER, seed=s) for s in (2, 3)]
        sampled = [client.chat.completions.create(model="tiny-gqa", messages=USER, temperature=1.5, seed=s)
                   for s in (2, 3)]  # fmt: skip
    assert greedy.choices[0].message.content
    assert all(u.choices[0].message.content == greedy.choices[0].message.content for u in unset)
    # the tiny model's logits are sharp enough that two seeds at 1.5 differ: the default really is what changed
    assert sampled[0].choices[0].message.content != sampled[1].choices[0].message.content

"""Every field of a chat request and what the server does with it: honoured, accepted as a no-op
(with the reason), or refused by name unless it holds its default.

``FIELDS`` covers OpenAI's chat completion request (openai-python 3.57) and the extra fields of
SGLang's (0.5.23, ``ChatCompletionRequest`` in ``sglang/srt/entrypoints/openai/protocol.py``); a
test checks that it names exactly the fields :class:`~leyline_server.api.schemas.ChatCompletionRequest`
accepts, so no field can be accepted and ignored. ``null`` always means "unset". A refused field
holding its default (``null``, or the value SGLang's router writes into every request it forwards)
is accepted: the router adds ``no_stop_trim``, ``ignore_eos``, ``continue_final_message``,
``skip_special_tokens``, ``separate_reasoning``, ``stream_reasoning`` and ``return_hidden_states``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from leyline_server.api.errors import APIError

__all__ = ["FIELDS", "Field", "refuse_unsupported", "honoured", "noop", "refused"]

Treatment = Literal["honoured", "no-op", "refused"]


@dataclass(frozen=True)
class Field:
    """One request field: its treatment, the values accepted when refused, and why."""

    treatment: Treatment
    why: str
    defaults: tuple[Any, ...] = (None,)


def honoured(why: str) -> Field:
    """A field the server honours (``why``: how)."""
    return Field("honoured", why)


def noop(why: str) -> Field:
    """A field accepted and ignored (``why``: why that is harmless)."""
    return Field("no-op", why)


def refused(why: str, *defaults: Any) -> Field:
    """A field refused with a 400 unless it is unset or holds one of ``defaults``."""
    return Field("refused", why, (None, *defaults))


_h, _noop, _no = honoured, noop, refused


_OPENAI = {
    "model": _h("404 model_not_found for a model not served here"),
    "messages": _h("rendered with the model's chat template; text parts only (other parts: 400)"),
    "tools": _h("rendered with the template; calls parsed from <tool_call> blocks"),
    "tool_choice": _h(
        "none, auto, required, a named function, allowed_tools (forced calls are decoded under a grammar)"
    ),
    "parallel_tool_calls": _h("false: at most one call (enforced when calls are constrained)"),
    "response_format": _h("text, json_object, json_schema (constrained decoding), SGLang's structural_tag"),
    "stream": _h("SSE chunks"),
    "stream_options": _h("include_usage"),
    "max_tokens": _h("completion limit; without it the completion may fill the context"),
    "max_completion_tokens": _h("as max_tokens"),
    "temperature": _h("0 is greedy"),
    "top_p": _h("nucleus sampling"),
    "seed": _h("reproducible sampling"),
    "stop": _h("up to 4 stop strings, cut from the output"),
    "n": Field("refused", "only one choice per request", (None, 1)),
    "presence_penalty": _h("OpenAI's definition, over the generated tokens"),
    "frequency_penalty": _h("OpenAI's definition, over the generated tokens"),
    "logit_bias": _h("token id -> bias in [-100, 100]"),
    "logprobs": _h("log-probabilities of the model (before penalties and constraints)"),
    "top_logprobs": _h("0 to 20 alternatives per token"),
    "user": _h("a hint of whose conversation it is: a session of another user is never continued"),
    "safety_identifier": _h("as user"),
    "metadata": _noop("tags for OpenAI's stored completions; nothing is stored (store: true is refused)"),
    "store": Field("refused", "completions are not stored", (None, False)),
    "service_tier": Field("refused", "one tier only", (None, "auto", "default")),
    "prompt_cache_key": _h(
        "names the conversation: a plain client's session is recognised by it (docs/design.md §8); the prefix "
        "cache itself is keyed by tokens only. Behind SGLang's router send it as X-SMG-Routing-Key too"
    ),
    "prompt_cache_retention": Field(
        "refused",
        "cached prefixes live in memory until evicted; a 24h retention cannot be promised",
        (None, "in_memory"),
    ),
    "prompt_cache_options": _no("cache breakpoints and lifetimes are not configurable; the prefix cache is automatic"),
    "functions": _no("the legacy 'functions' field is not supported; use 'tools'"),
    "function_call": _no("the legacy 'function_call' field is not supported; use 'tool_choice'"),
    "audio": _no("audio output is not supported"),
    "modalities": Field("refused", "only the 'text' modality is supported", (None, ["text"])),
    "prediction": _no("predicted outputs are not supported"),
    "reasoning_effort": _h("SGLang's meaning: chat template kwargs reasoning_effort, thinking and enable_thinking"),
    "verbosity": _no("'verbosity' is not supported by this model server"),
    "web_search_options": _no("web search is not supported"),
    "moderation": _no("moderation is not supported"),
    "leyline": _h("sessions and directives (the extension)"),
}

_SGLANG = {
    "top_k": _h("SGLang's top_k (-1 or null: off)"),
    "min_p": _h("SGLang's min_p (after temperature)"),
    "min_tokens": _h("stop tokens are forbidden until this many tokens exist"),
    "repetition_penalty": _h("SGLang's: generated tokens' positive logits divided, negative multiplied"),
    "stop_token_ids": _h("token ids that end generation"),
    "ignore_eos": _h("decode past the model's end-of-sequence tokens"),
    "no_stop_trim": _h("keep the matched stop string in the output"),
    "skip_special_tokens": _h("drop special tokens from the text (kept when tool calls are parsed, as SGLang does)"),
    "continue_final_message": _h("continue the last assistant message instead of starting a new one"),
    "chat_template_kwargs": _h("extra variables for the chat template (400 for one the template never reads)"),
    "separate_reasoning": _noop("no reasoning parser is configured (as SGLang without --reasoning-parser)"),
    "stream_reasoning": _noop("no reasoning parser is configured (as SGLang without --reasoning-parser)"),
    "regex": _h("constrained decoding: the output matches the regular expression"),
    "ebnf": _h("constrained decoding: the output matches the EBNF grammar (root rule 'root')"),
    "rid": _h("the completion's id"),
    "return_hidden_states": _no("hidden states are not returned", False),
    "return_routed_experts": _no("routed experts are not returned", False),
    "routed_experts_start_len": _no("routed experts are not returned", 0),
    "return_cached_tokens_details": _no("usage.prompt_tokens_details.cached_tokens is the detail", False),
    "return_spec_tokens_details": _no("there is no speculative decoding", False),
    "return_prompt_token_ids": _no("the prompt's tokens come from POST /v1/leyline/tokenize", False),
    "return_token_ids": _no("the completion's tokens are in leyline.completion_token_ids", False),
    "return_meta_info": _no("SGLang's meta_info is not returned", False),
    "return_input_ids_in_sglext": _no("SGLang's sglext is not returned", False),
    "return_output_ids_in_sglext": _no("SGLang's sglext is not returned", False),
    "return_sampling_mask": _no("sampling masks are not returned", False),
    "sampling_logprobs_mode": _no("logprobs are the model's, before penalties and constraints"),
    "return_flat_raw_output_top_logprobs": _no("SGLang's flat logprobs are not returned", False),
    "return_flat_raw_top_logprobs_b64": _no("SGLang's flat logprobs are not returned", True, False),
    "thinking": _no("no chat template here defines a thinking config; use chat_template_kwargs"),
    "task": _no("DeepSeek-V4 quick-instruction tasks are not supported"),
    "stop_regex": _no("stop strings only ('stop'); regular expressions are not supported"),
    "lora_path": _no("LoRA adapters are not supported"),
    "session_id": _no("SGLang sessions are not supported; Leyline sessions are the 'leyline' extension"),
    "session_params": _no("SGLang sessions are not supported; Leyline sessions are the 'leyline' extension"),
    "max_dynamic_patch": _no("the model takes no images"),
    "min_dynamic_patch": _no("the model takes no images"),
    "use_audio_in_video": _no("the model takes no audio or video", False),
    "images_config": _no("the model takes no images"),
    "video_config": _no("the model takes no video"),
    "mm_processor_kwargs": _no("the model takes no images, audio or video"),
    "custom_logit_processor": _no("custom logit processors (code from the request) are not run"),
    "custom_params": _no("custom logit processors (code from the request) are not run"),
    "watermark": _no("watermarking is not supported"),
    "input_ids": _no("the prompt is rendered from messages; token-level sessions are the 'leyline' extension"),
    "extra_key": _no("per-request cache partitions are not supported; --isolate-keys partitions per API key"),
    "cache_salt": _no("per-request cache partitions are not supported; --isolate-keys partitions per API key"),
    "priority": _no("requests are served first come, first served"),
    "data_parallel_rank": Field("refused", "one data-parallel rank (0)", (None, 0)),
    "routed_dp_rank": Field("refused", "one data-parallel rank (0)", (None, 0)),
    "disagg_prefill_dp_rank": _no("no prefill/decode disaggregation"),
    "bootstrap_host": _no("no prefill/decode disaggregation"),
    "bootstrap_port": _no("no prefill/decode disaggregation"),
    "bootstrap_room": _no("no prefill/decode disaggregation"),
}

FIELDS: dict[str, Field] = {**_OPENAI, **_SGLANG}


def refuse_unsupported(values: dict[str, Any], table: dict[str, Field] | None = None) -> None:
    """400 ``unsupported_parameter`` naming the first refused field of ``table`` (default: the chat
    request's :data:`FIELDS`) that holds more than its default."""
    for name, rule in (FIELDS if table is None else table).items():
        if rule.treatment == "refused" and name in values and values[name] not in rule.defaults:
            raise APIError(400, "unsupported_parameter", f"{name}: {rule.why}", name)

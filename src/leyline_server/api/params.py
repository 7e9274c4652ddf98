"""From a chat request to decoding parameters and template variables: honour every field, or refuse it by name.

What each field does is :data:`leyline_server.api.fields.FIELDS`; this module turns the honoured
ones into :class:`~leyline_server.contract.base.SamplingParams`, stop strings and chat template
keyword arguments. ``null`` is "unset" everywhere (OpenAI's and SGLang's defaults apply).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.api.errors import APIError
from leyline_server.api.fields import refuse_unsupported
from leyline_server.api.limits import check_json_depth
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.contract.values import Constraint, SamplingParams

__all__ = ["check_request", "sampling_params", "stop_strings", "template_kwargs"]

_RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "chat_template", "documents"})


def _invalid(message: str, param: str) -> APIError:
    return APIError(400, "invalid_request", message, param)


def check_request(req: ChatCompletionRequest) -> None:
    """400 for every refused field and for combinations that mean nothing (see the module docstring)."""
    check_json_depth(req.response_format, "response_format")  # before anything walks them recursively
    for i, tool in enumerate(req.tools or ()):
        check_json_depth(tool, f"tools.{i}")
    check_json_depth(req.tool_choice, "tool_choice")
    refuse_unsupported(req.model_dump(exclude_unset=True, exclude={"messages", "leyline"}))
    if req.top_logprobs and not req.logprobs:
        raise _invalid("top_logprobs requires logprobs: true", "top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise _invalid("stream_options requires stream: true", "stream_options")
    unknown = set(req.stream_options or {}) - {"include_usage", "continuous_usage_stats"}
    if unknown:
        raise APIError(400, "unsupported_parameter", f"unsupported stream_options: {sorted(unknown)}", "stream_options")
    if (req.stream_options or {}).get("continuous_usage_stats"):
        raise APIError(400, "unsupported_parameter", "usage is reported once, at the end", "stream_options")
    if req.top_k == 0:
        raise _invalid("top_k must be -1 (off) or at least 1", "top_k")


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (raw or {}).items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10) or int(key) >= vocab_size:
            raise _invalid(f"logit_bias key {key!r} is not a token id", "logit_bias")
        if not -100 <= value <= 100:
            raise _invalid("logit_bias values must lie in [-100, 100]", "logit_bias")
        out[int(key)] = float(value)
    return out


def _stop_token_ids(ids: list[int] | None, vocab_size: int) -> list[int]:
    for token in ids or []:
        if not 0 <= token < vocab_size:
            raise _invalid(f"stop_token_ids: {token} is not a token id", "stop_token_ids")
    return list(ids or [])


_OPENAI = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
SAMPLING_FIELDS = frozenset(_OPENAI)


def sampling_params(
    req: ChatCompletionRequest,
    prompt_tokens: int,
    context: int,
    vocab_size: int,
    constraint: Constraint | None = None,
    defaults: Mapping[str, float] | None = None,
) -> SamplingParams:
    """Decoding parameters; without ``max_tokens`` the completion may fill the context (vLLM's rule).

    400 ``context_length_exceeded`` when the prompt leaves no room, or when an explicit
    ``max_tokens`` does not fit. ``defaults``: what the sampling fields the request leaves unset
    take (``ServerConfig.sampling``; vLLM's ``--generation-config``), else OpenAI's defaults.
    """
    unset = {**_OPENAI, **(defaults or {})}
    room = context - prompt_tokens
    asked = req.max_completion_tokens or req.max_tokens
    if room < 1 or (asked is not None and asked > room):
        wanted = f" + {asked} max tokens" if asked is not None else ""
        raise APIError(
            400,
            FallbackCode.CONTEXT_LENGTH.value,
            f"{prompt_tokens} prompt tokens{wanted} exceed the context of {context} tokens",
            "messages",
        )
    return SamplingParams(
        max_tokens=asked if asked is not None else room,
        temperature=unset["temperature"] if req.temperature is None else req.temperature,
        top_p=unset["top_p"] if req.top_p is None else req.top_p,
        seed=req.seed,
        presence_penalty=unset["presence_penalty"] if req.presence_penalty is None else req.presence_penalty,
        frequency_penalty=unset["frequency_penalty"] if req.frequency_penalty is None else req.frequency_penalty,
        logit_bias=_logit_bias(req.logit_bias, vocab_size),
        logprobs=bool(req.logprobs),
        top_logprobs=req.top_logprobs or 0,
        top_k=max(int(unset["top_k"]) if req.top_k is None else req.top_k, 0),
        min_p=unset["min_p"] if req.min_p is None else req.min_p,
        repetition_penalty=unset["repetition_penalty"] if req.repetition_penalty is None else req.repetition_penalty,
        min_tokens=req.min_tokens or 0,
        ignore_eos=bool(req.ignore_eos),
        stop_token_ids=_stop_token_ids(req.stop_token_ids, vocab_size),
        constraint=constraint,
    )


def stop_strings(req: ChatCompletionRequest) -> list[str]:
    """The request's stop strings (OpenAI allows up to 4)."""
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > 4:
        raise _invalid("at most 4 stop sequences", "stop")
    return [s for s in stops if s]


def template_kwargs(req: ChatCompletionRequest, template: str) -> dict[str, Any]:
    """Extra chat template variables: ``chat_template_kwargs`` and SGLang's reading of ``reasoning_effort``.

    A variable the template never mentions would change nothing: 400 naming it (the template's
    own names, ``messages``/``tools``/``add_generation_prompt``/``chat_template``, are refused too).
    """
    kwargs = dict(req.chat_template_kwargs or {})
    for key in kwargs:
        where = f"chat_template_kwargs.{key}"
        if key in _RESERVED_KWARGS:
            raise APIError(400, "unsupported_parameter", f"{key!r} cannot be set through chat_template_kwargs", where)
        if key not in template:
            raise APIError(400, "unsupported_parameter", f"the chat template does not use {key!r}", where)
    effort = req.reasoning_effort
    if effort is not None:
        names = [n for n in ("reasoning_effort", "thinking", "enable_thinking") if n in template]
        if not names:
            raise APIError(
                400, "unsupported_parameter", "the chat template has no reasoning switch", "reasoning_effort"
            )
        kwargs.setdefault("reasoning_effort", effort)
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs

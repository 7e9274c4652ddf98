"""From an OpenAI request to decoding parameters: honour every field, or refuse it by name.

Nothing accepted is ignored: a field either changes what the server does or is refused with a
400 whose ``param`` names it.
"""

from __future__ import annotations

from typing import Any

from leyline_server.api.errors import APIError
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.engines.base import SamplingParams

__all__ = ["sampling_params", "refuse_unsupported", "stop_strings", "tool_parsing"]

_UNSUPPORTED = {
    "functions": "the legacy 'functions' field is not supported; use 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; use 'tool_choice'",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "'reasoning_effort' is not supported by this model server",
    "web_search_options": "web search is not supported",
}


def _refuse(param: str, message: str) -> APIError:
    return APIError(400, "unsupported_parameter", message, param)


def refuse_unsupported(req: ChatCompletionRequest) -> None:
    """400 for every field this server cannot honour (see the module docstring)."""
    for name, message in _UNSUPPORTED.items():
        if getattr(req, name) is not None:
            raise _refuse(name, message)
    if req.n != 1:
        raise _refuse("n", "only n=1 is supported")
    if req.modalities is not None and list(req.modalities) != ["text"]:
        raise _refuse("modalities", "only the 'text' modality is supported")
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        raise _refuse("response_format", "only response_format {'type': 'text'} is supported")
    if req.store:
        raise _refuse("store", "this server does not store completions (store must be false)")
    if req.service_tier not in (None, "auto", "default"):
        raise _refuse("service_tier", "only service_tier 'auto' or 'default' is supported")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "invalid_request", "top_logprobs requires logprobs: true", "top_logprobs")
    if req.tool_choice not in (None, "auto", "none"):
        raise _refuse("tool_choice", "only tool_choice 'auto' or 'none' is supported")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "invalid_request", "stream_options requires stream: true", "stream_options")
    unknown = set(req.stream_options or {}) - {"include_usage"}
    if unknown:
        raise _refuse("stream_options", f"unsupported stream_options: {sorted(unknown)}")


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (raw or {}).items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10) or int(key) >= vocab_size:
            raise APIError(400, "invalid_request", f"logit_bias key {key!r} is not a token id", "logit_bias")
        if not -100 <= value <= 100:
            raise APIError(400, "invalid_request", "logit_bias values must lie in [-100, 100]", "logit_bias")
        out[int(key)] = float(value)
    return out


def sampling_params(req: ChatCompletionRequest, prompt_tokens: int, context: int, vocab_size: int) -> SamplingParams:
    """Decoding parameters; without ``max_tokens`` the completion may fill the context (vLLM's rule).

    400 ``context_length_exceeded`` when the prompt leaves no room, or when an explicit
    ``max_tokens`` does not fit.
    """
    refuse_unsupported(req)
    room = context - prompt_tokens
    asked = req.max_completion_tokens or req.max_tokens
    if room < 1 or (asked is not None and asked > room):
        wanted = f" + {asked} max tokens" if asked is not None else ""
        raise APIError(
            400,
            "context_length_exceeded",
            f"{prompt_tokens} prompt tokens{wanted} exceed the context of {context} tokens",
            "messages",
        )
    return SamplingParams(
        max_tokens=asked if asked is not None else room,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=_logit_bias(req.logit_bias, vocab_size),
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs or 0,
    )


def stop_strings(req: ChatCompletionRequest) -> list[str]:
    """The request's stop strings (OpenAI allows up to 4)."""
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > 4:
        raise APIError(400, "invalid_request", "at most 4 stop sequences", "stop")
    return [s for s in stops if s]


def tool_parsing(req: ChatCompletionRequest) -> dict[str, Any]:
    """How to treat tool calls in the output: parse them at all, and keep more than one."""
    return {"parse": req.tool_choice != "none", "parallel": req.parallel_tool_calls is not False}

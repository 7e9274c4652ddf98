"""Leyline's sampling parameters in SGLang's terms, and SGLang's stream chunks as generation steps.

SGLang streams cumulative ``output_ids`` (and, with logprobs, cumulative
``meta_info.output_token_logprobs`` / ``output_top_logprobs`` as ``(logprob, token, text)``
tuples); :class:`StepReader` turns each chunk into the steps not yet seen, the last one carrying
the finish reason. Logprobs are SGLang's (it reports them before temperature scaling unless
configured otherwise); SGLang stops on the model's EOS tokens plus ``stop_token_ids``.

A :class:`~leyline_server.contract.base.Constraint` becomes the SGLang sampling parameter of the
same name (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``), which SGLang's grammar backend
(xgrammar by default) compiles. SGLang compiles JSON schemas with free whitespace unless it was
launched with ``--constrained-json-disable-any-whitespace`` (the other engines' compact form);
forced tool calls are structural tags whose arguments are EBNF grammars, the same on every engine.
"""

from __future__ import annotations

from typing import Any

from leyline_server.contract.values import Constraint, GenerationStep, SamplingParams, TokenLogprob

__all__ = ["StepReader", "sampling_dict", "logprob_args", "constraint_args"]


def sampling_dict(params: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``params`` (temperature 0 is greedy in both)."""
    out: dict[str, Any] = {
        "max_new_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
    }
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.logit_bias:
        out["logit_bias"] = {str(k): float(v) for k, v in params.logit_bias.items()}
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    if params.top_k:
        out["top_k"] = params.top_k
    if params.min_p:
        out["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        out["repetition_penalty"] = params.repetition_penalty
    if params.min_tokens:
        out["min_new_tokens"] = params.min_tokens
    if params.ignore_eos:
        out["ignore_eos"] = True
    if params.constraint is not None:
        out.update(constraint_args(params.constraint))
    return out


def constraint_args(constraint: Constraint) -> dict[str, Any]:
    """SGLang's sampling parameter for ``constraint``: ``{kind: value}`` (each takes the text as is)."""
    return {constraint.kind: constraint.value}


def logprob_args(params: SamplingParams) -> dict[str, Any]:
    """The ``GenerateReqInput`` fields that ask for logprobs (none when not asked)."""
    if not params.logprobs:
        return {}
    return {"return_logprob": True, "top_logprobs_num": params.top_logprobs}


def _finish(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    if kind == "abort":
        message = reason.get("message", "") if isinstance(reason, dict) else ""
        raise RuntimeError(f"SGLang aborted the request: {message}")
    return "length" if kind == "length" else "stop"


class StepReader:
    """Turns cumulative SGLang stream chunks into new :class:`GenerationStep` s."""

    def __init__(self) -> None:
        self.seen = 0

    def steps(self, chunk: dict[str, Any]) -> list[GenerationStep]:
        """The steps ``chunk`` adds; the last carries ``finish_reason`` when the request finished."""
        ids = list(chunk.get("output_ids") or [])
        meta = chunk.get("meta_info") or {}
        logprobs = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        steps = []
        for i in range(self.seen, len(ids)):
            step = GenerationStep(token=int(ids[i]))
            if i < len(logprobs) and logprobs[i] is not None:
                step.logprob = float(logprobs[i][0])
            if i < len(tops) and tops[i]:
                step.top_logprobs = [TokenLogprob(int(t[1]), float(t[0])) for t in tops[i]]
            steps.append(step)
        self.seen = len(ids)
        reason = _finish(meta)
        if reason is not None and steps:
            steps[-1].finish_reason = reason
        return steps

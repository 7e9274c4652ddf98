"""A small, strict Leyline server for SDK tests (in-process ASGI; no model, no engine).

It renders every prompt itself with a *full* render of the project's tiny tokenizer (the truth
the SDK's incremental rendering must match), keeps each session's base (prompt + completion),
checks every request the way the real server does — base length and digest, ``apply(base, D)``
a prefix of the prompt — and records what it saw, so tests can assert on the server's view
rather than on what the SDK believes it sent. Knobs: ``drop(session_id)`` forgets a session
(the LRU drop of the real server: an unknown id is served as a new session and reported as
``base_mismatch``; a strict request gets a 404 ``session_not_found``), ``completion`` is the
text the "model" answers, ``leyline=False`` makes it a plain OpenAI server (no Leyline routes,
no ``leyline`` field), ``block_routes=False`` a Leyline server without ``/leyline/blocks``.

Blocks (``/v1/leyline/blocks``) behave like the real server's: owned by the bearer key (another
key's id is a 404 ``block_not_found``), created from ``tokens`` or from ``messages`` (their exact
tokens without preamble or generation prompt); a directive naming a block must have an empty
replacement or exactly the block's tokens, and an unknown block refuses the splice with
``span_invalid`` (the message names the block), like ``leyline_server.splice.execute``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from leyline_sdk.core.directives import Directive, apply, check, digest, first_forget_start, kept_runs
from leyline_sdk.core.errors import DirectiveError
from leyline_sdk.render.rendering import HFChatTokenizer


@dataclass
class Seen:
    """One chat request as the server saw it."""

    prompt: list[int]
    leyline: dict[str, Any] | None
    fallback: str | None
    spliced: list[int] | None  # apply(base, directives) when directives were applied
    messages: list[dict[str, Any]]
    fallback_message: str = ""


@dataclass
class FakeLeyline:
    """State and checks of the fake server; ``app`` is its ASGI app."""

    chat: HFChatTokenizer
    leyline: bool = True
    completion: str = "ok"
    sessions: dict[str, list[int]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    chats: list[Seen] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    block_routes: bool = True
    blocks: dict[str, tuple[str | None, list[int]]] = field(default_factory=dict)  # id -> (owner, tokens)
    placed: list[str] = field(default_factory=list)  # block ids placed by applied directives, in order

    def drop(self, session_id: str) -> None:
        """Forget a session, as the real server's LRU does."""
        del self.sessions[session_id]

    def tokenize_calls(self) -> int:
        """How many ``/leyline/tokenize`` requests arrived."""
        return sum(1 for _, path in self.requests if path.endswith("/leyline/tokenize"))

    def client(self) -> httpx.AsyncClient:
        """An httpx client that talks to this server in-process."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app()), base_url="http://fake")

    # -- protocol ---------------------------------------------------------------------------------
    def _completion_tokens(self) -> list[int]:
        text = self.completion + "<|im_end|>"
        return list(self.chat.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _resolve(self, directives: list[Directive], owner: str | None) -> tuple[list[Directive], str]:
        """Directives with block tokens filled in, or ``([], why)`` for an unknown or different block."""
        out = []
        for i, d in enumerate(directives):
            if d.block is None:
                out.append(d)
                continue
            found = self.blocks.get(d.block)
            if found is None or found[0] != owner:
                return [], f"directive {i}: unknown block {d.block!r}"
            if d.replacement and list(d.replacement) != found[1]:
                return [], f"directive {i}: replacement differs from block {d.block!r}"
            out.append(d if d.replacement else d.model_copy(update={"replacement": tuple(found[1])}))
        return out, ""

    def _splice(
        self, base: list[int], ext: dict[str, Any], prompt: list[int] | None, owner: str | None = None
    ) -> tuple[list[int] | None, str, str]:
        """``(apply(base, D), "", "")`` or ``(None, fallback code, message)`` — the real server's checks."""
        ref = ext.get("base")
        if ref is not None and (ref["length"] != len(base) or ref.get("digest") != digest(base)):
            return None, "base_mismatch", "base"
        directives = [Directive.model_validate(d) for d in ext.get("directives") or []]
        try:
            check(directives, len(base))
        except DirectiveError as exc:
            return None, "span_invalid", str(exc)
        directives, why = self._resolve(directives, owner)
        if why:
            return None, "span_invalid", why
        spliced = apply(base, directives)
        if prompt is not None and prompt[: len(spliced)] != spliced:
            return None, "prompt_mismatch", "apply(base, directives) is not a prefix of the prompt"
        if first_forget_start(directives) is None:
            self.placed += [d.block for d in directives if d.block is not None]
        return spliced, "", ""

    @staticmethod
    def counts(base: list[int], directives: list[Directive], spliced: list[int], prompt_length: int) -> dict[str, int]:
        """Reused (before the first directive), rotated (kept after it, before any forget), prefilled."""
        if not directives:
            return {
                "reused_tokens": len(spliced),
                "rotated_tokens": 0,
                "prefilled_tokens": prompt_length - len(spliced),
            }
        first = directives[0].start
        forget = first_forget_start(directives)
        rotated = sum(
            r.old_end - r.old_start
            for r in kept_runs(len(base), directives)
            if r.old_start >= first and (forget is None or r.old_end <= forget)
        )
        if forget is None:  # placed blocks: relocated, not computed
            rotated += sum(len(d.replacement) for d in directives if d.block is not None)
        return {
            "reused_tokens": first,
            "rotated_tokens": rotated,
            "prefilled_tokens": prompt_length - first - rotated,
            "approximate_tokens": prompt_length - first if rotated else 0,
        }

    def _chat(self, body: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
        messages = body["messages"]
        prompt = self.chat.render(messages, tools=body.get("tools")).tokens
        completion = self._completion_tokens()
        ext = body.get("leyline")
        if ext is None or not self.leyline:
            self.chats.append(Seen(prompt, None, None, None, messages))
            return self._response(body, prompt, completion, None)
        sid, fallback, spliced, message = ext.get("session_id"), None, None, ""
        counts = {"reused_tokens": 0, "rotated_tokens": 0, "prefilled_tokens": len(prompt)}
        if sid is not None and sid not in self.sessions:
            if ext.get("strict"):
                raise _NotFound("session_not_found")
            fallback, sid = "base_mismatch", None  # dropped: served as a new session
        if sid is not None:
            base = self.sessions[sid]
            spliced, code, message = self._splice(base, ext, prompt, owner)
            if spliced is None:
                fallback = code
            else:
                directives = [Directive.model_validate(d) for d in ext.get("directives") or []]
                directives, _ = self._resolve(directives, owner)
                counts = self.counts(base, directives, spliced, len(prompt))
        sid = sid or secrets.token_hex(8)
        self.sessions[sid] = prompt + completion
        self.chats.append(Seen(prompt, ext, fallback, spliced, messages, message))
        leyline = {
            "session_id": sid,
            "base": {"length": len(prompt + completion), "digest": digest(prompt + completion)},
            "applied": fallback is None,
            "fallback": {"code": fallback, "message": message or "fake"} if fallback else None,
            "completion_token_ids": completion,
            **counts,
        }
        return self._response(body, prompt, completion, leyline)

    def _response(self, body: dict[str, Any], prompt: list[int], completion: list[int], leyline: Any) -> dict[str, Any]:
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(completion),
            "total_tokens": len(prompt) + len(completion),
            "prompt_tokens_details": {
                "cached_tokens": (leyline or {}).get("reused_tokens", 0) + (leyline or {}).get("rotated_tokens", 0)
            },
        }
        out = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.completion}}
            ],
            "usage": usage,
        }
        if leyline is not None:
            out["leyline"] = leyline
        return out

    def _directives(self, sid: str, body: dict[str, Any], owner: str | None = None) -> JSONResponse:
        if sid not in self.sessions:
            return JSONResponse({"error": {"code": "session_not_found", "message": "no such session"}}, 404)
        base = self.sessions[sid]
        spliced, code, _ = self._splice(base, body, None, owner)
        if spliced is not None:
            self.sessions[sid] = spliced
        directives, _ = self._resolve([Directive.model_validate(d) for d in body.get("directives") or []], owner)
        counts = self.counts(base, directives, spliced, len(spliced)) if spliced is not None else {}
        now = self.sessions[sid]
        return JSONResponse(
            {
                "id": sid,
                "object": "leyline.session",
                "base": {"length": len(now), "digest": digest(now)},
                "applied": spliced is not None,
                "fallback": {"code": code, "message": "fake"} if spliced is None else None,
                **counts,
            }
        )

    def _create_block(self, body: dict[str, Any], owner: str | None) -> JSONResponse:
        if ("tokens" in body) == ("messages" in body):
            return _error(400, "invalid_request", "give exactly one of 'messages' and 'tokens'")
        if "tokens" in body:
            tokens = list(body["tokens"])
        else:
            r = self.chat.render(body["messages"], tools=body.get("tools"), add_generation_prompt=False)
            tokens = r.tokens[r.message_spans[0].start : r.message_spans[-1].end]
        if not tokens:
            return _error(400, "empty_block", "a block needs at least one token")
        block_id = "blk_" + secrets.token_hex(8)
        self.blocks[block_id] = (owner, tokens)
        return JSONResponse(_block(block_id, tokens))

    def _block(self, block_id: str, owner: str | None, delete: bool = False) -> JSONResponse:
        found = self.blocks.get(block_id)
        if found is None or found[0] != owner:
            return _error(404, "block_not_found", f"unknown block {block_id!r}")
        if delete:
            del self.blocks[block_id]
            return JSONResponse({"id": block_id, "object": "leyline.block.deleted", "deleted": True})
        return JSONResponse(_block(block_id, found[1]))

    # -- routes -----------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        """The ASGI app (routes bound to this state)."""
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next: Any) -> Any:
            self.requests.append((request.method, request.url.path))
            return await call_next(request)

        @app.post("/v1/chat/completions")
        async def chat(body: dict[str, Any], request: Request) -> Any:
            try:
                out = self._chat(body, _owner(request))
            except _NotFound as exc:
                return JSONResponse({"error": {"code": exc.code, "message": "no such session"}}, 404)
            if not body.get("stream"):
                return out
            return StreamingResponse(_sse(out), media_type="text/event-stream")

        if self.leyline:

            @app.post("/v1/leyline/tokenize")
            async def tokenize(body: dict[str, Any]) -> dict[str, Any]:
                r = self.chat.render(body["messages"], tools=body.get("tools"))
                spans = [{"start": s.start, "end": s.end} for s in r.message_spans]
                return {"tokens": r.tokens, "message_spans": spans, "prefix_stable": r.prefix_stable}

            @app.post("/v1/leyline/sessions/{sid}/directives")
            async def directives(sid: str, body: dict[str, Any], request: Request) -> JSONResponse:
                return self._directives(sid, body, _owner(request))

            @app.delete("/v1/leyline/sessions/{sid}")
            async def delete(sid: str) -> JSONResponse:
                if self.sessions.pop(sid, None) is None:
                    return JSONResponse({"error": {"code": "session_not_found", "message": "gone"}}, 404)
                self.deleted.append(sid)
                return JSONResponse({"id": sid, "deleted": True})

        if self.leyline and self.block_routes:

            @app.post("/v1/leyline/blocks")
            async def create_block(body: dict[str, Any], request: Request) -> JSONResponse:
                return self._create_block(body, _owner(request))

            @app.get("/v1/leyline/blocks/{block_id}")
            async def get_block(block_id: str, request: Request) -> JSONResponse:
                return self._block(block_id, _owner(request))

            @app.delete("/v1/leyline/blocks/{block_id}")
            async def delete_block(block_id: str, request: Request) -> JSONResponse:
                return self._block(block_id, _owner(request), delete=True)

        return app


def _owner(request: Request) -> str | None:
    """The bearer key of a request (``None`` without one): what blocks belong to."""
    auth = request.headers.get("authorization", "")
    return auth.removeprefix("Bearer ") or None


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status)


def _block(block_id: str, tokens: list[int]) -> dict[str, Any]:
    return {"id": block_id, "object": "leyline.block", "length": len(tokens), "tokens": tokens}


class _NotFound(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _sse(response: dict[str, Any]):
    """The response as two chunks (content, then finish with ``leyline`` and usage)."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": 0, "model": response["model"]}
    text = response["choices"][0]["message"]["content"]
    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": response["usage"]}
    if "leyline" in response:
        last["leyline"] = response["leyline"]
    for chunk in (first, last):
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"

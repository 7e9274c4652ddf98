"""LeylineSession: one conversation, its policies, and the directives that keep the server's cache in sync.

The session keeps two histories: the **full** one the agent wrote (never changed by Leyline,
nothing lost) and the **effective** one the model sees (after policies; earlier edits are
sticky, so an evicted message renders the same way every later turn). Before each request it:

1. runs the policies over the full history;
2. renders the effective history (the server's ``/tokenize``, or a local ``ChatTokenizer``);
3. diffs the edited first ``k`` messages (``k`` = messages the server has seen) against the
   previous rendering, message by message (``diff_to_directives``), each span in the mode of the
   edit that caused it;
4. checks the generated tokens against the re-rendered assistant message; from where they differ
   the tail is replaced in ``forget`` mode;
5. verifies locally that ``apply(base, D)`` is a prefix of the new prompt, and sends the
   directives with the base's length and digest.

Anything that does not check out (unknown base, a client tokenizer that disagrees with the
server's, an unstable template) sends no directives: the server's prefix cache then re-prefills
from the first difference — that is ``forget``, never a wrong cache. ``strict=True`` raises
instead (and asks the server to be strict too).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from leyline_sdk.directives import Directive, Mode, apply, digest
from leyline_sdk.errors import SpliceFallbackError
from leyline_sdk.rendering import RenderedConversation
from leyline_sdk.spans import common_prefix_length, diff_to_directives

if TYPE_CHECKING:
    from leyline_sdk.client import AsyncLeyline

__all__ = ["LeylineSession", "TurnStats"]


class TurnStats(BaseModel):
    """What one request cost and what Leyline did."""

    turn: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reused_tokens: int = 0
    rotated_tokens: int = 0
    prefilled_tokens: int = 0
    directives: int = 0
    fallback: str | None = None
    cleared: int = 0
    removed_chars: int = 0
    elapsed_ms: float = 0.0


class LeylineSession:
    """A conversation with the server; see the module docstring for the protocol."""

    def __init__(
        self,
        client: AsyncLeyline,
        policies: Sequence[Any] = (),
        strict: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.client = client
        self.policies = list(policies)
        self.strict = strict
        self.tools = list(tools) if tools else None
        self.history: list[dict[str, Any]] = []
        self.effective: list[dict[str, Any]] = []
        self.sticky: dict[int, Any] = {}
        self.session_id: str | None = None
        self.base_tokens: list[int] | None = None
        self._seen: list[dict[str, Any]] = []  # effective messages the server has (the base's prompt part)
        self._seen_render: RenderedConversation | None = None
        self.stats: list[TurnStats] = []
        self._local_fallback: str | None = None
        self.last_directives: list[Directive] = []  # what the last request sent (for inspection)

    # -- policies and directives --------------------------------------------------------------------
    def _run_policies(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], dict[int, Mode], Any]:
        from leyline_policies import run_policies

        effective, edits, report = run_policies(messages, self.policies, tools, sticky=self.sticky)
        new_modes = {c.index: Mode(c.mode) for c in report.cleared}
        self.sticky = edits
        return effective, new_modes, report

    def _fallback(self, code: str, message: str) -> None:
        if self.strict:
            raise SpliceFallbackError(code, message)
        self._local_fallback = code

    async def _directives(
        self, effective: list[dict[str, Any]], prompt: RenderedConversation, modes: Mapping[int, Mode], tools: Any
    ) -> list[Directive] | None:
        """Directives turning the base into a prefix of ``prompt``; ``None``: send none (forget)."""
        base, old = self.base_tokens, self._seen_render
        if base is None or old is None:
            self._fallback("base_mismatch", "the client does not know the server's base")
            return None
        k = len(self._seen)
        if len(effective) < k or any(
            a.get("role") != b.get("role") for a, b in zip(effective, self._seen, strict=False)
        ):
            self._fallback("prompt_mismatch", "the agent rewrote messages the server has seen")
            return None
        mid = await self.client.render(effective[:k], tools, generation=True)
        directives = diff_to_directives(old, mid, modes=dict(modes))
        spliced = apply(base, directives)
        c = common_prefix_length(spliced, prompt.tokens)
        if c < len(mid.tokens):  # the edited history itself does not reproduce: unexplained
            self._fallback("prompt_mismatch", "the re-rendered history does not extend the edited base")
            return None
        if c < len(spliced):  # generated tokens differ from the re-rendered assistant message
            shift = sum(d.delta for d in directives)
            directives.append(
                Directive(start=c - shift, end=len(base), replacement=tuple(prompt.tokens[c:]), mode=Mode.FORGET)
            )
        result = apply(base, directives)
        if prompt.tokens[: len(result)] != result:  # never send what does not check out
            self._fallback("prompt_mismatch", "directives do not reproduce the prompt")
            return None
        return directives

    # -- requests -------------------------------------------------------------------------------------
    async def _prepare(self, messages: Sequence[Mapping[str, Any]] | None, tools: Any) -> tuple[dict[str, Any], Any]:
        if messages is not None:
            self.history = [dict(m) for m in messages]
        tools = tools if tools is not None else self.tools
        effective, modes, report = self._run_policies(self.history, tools)
        self.effective = effective
        self._local_fallback = None
        self.last_directives = []
        extension: dict[str, Any] | None = None
        prompt: RenderedConversation | None = None
        if await self.client.leyline_available():
            prompt = await self.client.render(effective, tools, generation=True)
            extension = {"strict": self.strict}
            if self.session_id is not None:
                extension["session_id"] = self.session_id
                directives = await self._directives(effective, prompt, modes, tools)
                self.last_directives = directives or []
                if directives:
                    assert self.base_tokens is not None
                    extension["base"] = {"length": len(self.base_tokens), "digest": digest(self.base_tokens)}
                    extension["directives"] = [d.model_dump(mode="json") for d in directives]
        return {"effective": effective, "extension": extension, "prompt": prompt, "report": report}, tools

    def _record(self, prep: dict[str, Any], leyline: Mapping[str, Any] | None, usage: Any, started: float) -> None:
        prompt: RenderedConversation | None = prep["prompt"]
        report = prep["report"]
        stats = TurnStats(
            turn=len(self.stats) + 1,
            cleared=len(report.cleared),
            removed_chars=report.removed_chars,
            elapsed_ms=(time.perf_counter() - started) * 1e3,
            directives=len((prep["extension"] or {}).get("directives", [])),
        )
        if usage is not None:
            stats.prompt_tokens = usage.prompt_tokens
            details = getattr(usage, "prompt_tokens_details", None)
            stats.cached_tokens = getattr(details, "cached_tokens", 0) or 0
        stats.fallback = self._local_fallback
        if leyline is not None and prompt is not None:
            fb = leyline.get("fallback")
            stats.fallback = (fb or {}).get("code") or stats.fallback
            if fb and self.strict:
                raise SpliceFallbackError(fb["code"], fb.get("message", ""))
            stats.reused_tokens = leyline.get("reused_tokens", 0)
            stats.rotated_tokens = leyline.get("rotated_tokens", 0)
            stats.prefilled_tokens = leyline.get("prefilled_tokens", 0)
            self.session_id = leyline.get("session_id") or self.session_id
            tokens = prompt.tokens + list(leyline.get("completion_token_ids", []))
            server_base = leyline.get("base") or {}
            if server_base.get("digest") == digest(tokens):
                self.base_tokens = tokens
                self._seen, self._seen_render = list(prep["effective"]), prompt
            else:  # our rendering disagrees with the server's: no directives until it agrees again
                self.base_tokens, self._seen, self._seen_render = None, [], None
                stats.fallback = stats.fallback or "tokenizer_mismatch"
        self.stats.append(stats)

    async def create(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """Send the (full) history; returns what ``openai``'s ``create`` returns, with ``.leyline``."""
        started = time.perf_counter()
        prep, tools = await self._prepare(messages, tools)
        body: dict[str, Any] = {"model": model, "messages": prep["effective"], "stream": stream, **kwargs}
        if tools:
            body["tools"] = list(tools)
        if prep["extension"] is not None:
            body["leyline"] = prep["extension"]
        if not stream:
            response = ChatCompletion.model_validate(
                await self.client.transport.request("POST", "/chat/completions", body)
            )
            self._record(prep, getattr(response, "leyline", None), response.usage, started)
            return response
        return self._stream(body, prep, started)

    async def _stream(
        self, body: dict[str, Any], prep: dict[str, Any], started: float
    ) -> AsyncIterator[ChatCompletionChunk]:
        leyline, usage = None, None
        async for event in self.client.transport.stream("/chat/completions", body):
            chunk = ChatCompletionChunk.model_validate(event)
            leyline = getattr(chunk, "leyline", None) or leyline
            usage = chunk.usage or usage
            yield chunk
        self._record(prep, leyline, usage, started)

    async def apply_edits(self, tools: Sequence[Mapping[str, Any]] | None = None) -> TurnStats | None:
        """Run the policies now and splice the server's cache without generating (off the critical path).

        Returns the stats of the splice, or ``None`` when there is nothing to send.
        """
        if self.session_id is None or not await self.client.leyline_available():
            return None
        started = time.perf_counter()
        tools = tools if tools is not None else self.tools
        effective, modes, report = self._run_policies(self.history, tools)
        self.effective = effective
        k = len(self._seen)
        if self.base_tokens is None or self._seen_render is None or len(effective) < k:
            return None
        mid = await self.client.render(effective[:k], tools, generation=True)
        directives = diff_to_directives(self._seen_render, mid, modes=dict(modes))
        if not directives:
            return None
        body = {
            "base": {"length": len(self.base_tokens), "digest": digest(self.base_tokens)},
            "directives": [d.model_dump(mode="json") for d in directives],
            "strict": self.strict,
        }
        result = await self.client.transport.request("POST", f"/leyline/sessions/{self.session_id}/directives", body)
        new_base = apply(self.base_tokens, directives)
        if result["base"]["digest"] == digest(new_base):
            self.base_tokens, self._seen, self._seen_render = new_base, effective[:k], mid
        else:
            self.base_tokens, self._seen, self._seen_render = None, [], None
        fb = result.get("fallback")
        stats = TurnStats(
            turn=len(self.stats) + 1,
            reused_tokens=result["reused_tokens"],
            rotated_tokens=result["rotated_tokens"],
            prefilled_tokens=result["prefilled_tokens"],
            directives=len(directives),
            fallback=(fb or {}).get("code"),
            cleared=len(report.cleared),
            removed_chars=report.removed_chars,
            elapsed_ms=(time.perf_counter() - started) * 1e3,
        )
        self.stats.append(stats)
        return stats

    def matches(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Length of the history prefix ``messages`` shares with this session (0 if it diverges)."""
        n = len(self.history)
        if n == 0 or len(messages) < n:
            return 0
        return n if all(dict(a) == dict(b) for a, b in zip(self.history, messages[:n], strict=True)) else 0

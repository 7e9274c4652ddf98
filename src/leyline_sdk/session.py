"""LeylineSession: one conversation, its policies, and the directives that keep the server's cache in sync.

The session keeps two histories: the **full** one the agent wrote (never changed by Leyline,
nothing lost) and the **effective** one the model sees (after policies; earlier edits are
sticky, so an evicted message renders the same way every later turn). Each turn it:

1. runs the policies over the full history;
2. renders the effective history once (its :class:`~leyline_sdk.renderer.Renderer`: a local
   tokenizer, incrementally, or one ``/leyline/tokenize`` round trip);
3. diffs the first ``k`` messages (``k`` = the messages the server has seen) against the
   rendering of the base, message by message (``diff_to_directives``), each span in the mode of
   the edit that caused it;
4. checks the generated tokens against the re-rendered assistant message; from where they
   differ they are dropped in ``forget`` mode;
5. verifies locally that ``apply(base, D)`` is a prefix of the new prompt, and sends the
   directives with the base's length and digest.

:meth:`LeylineSession.sync_edits` does steps 1–3 and 5 without generating (splice while a tool
runs). Anything that does not check out (unknown base, a client tokenizer that disagrees with
the server's, an unstable template) sends no directives: the server's prefix cache then
re-prefills from the first difference — that is ``forget``, never a wrong cache. ``strict=True``
raises instead (and asks the server to be strict too). A server that dropped the session answers
with a new ``session_id`` (``fallback.code == "base_mismatch"``); the session adopts it.

The session sends nothing itself for a turn: :meth:`LeylineSession.prepare` returns the request
(a ``_Turn``: the effective messages and the ``leyline`` extension) and the client's
``chat.completions`` sends it with openai's own ``create``, then hands the response (or the end
of the stream) to :meth:`LeylineSession.record`. Its other requests (``/leyline/tokenize``,
directives, delete) go through the client's :class:`~leyline_sdk.routes.LeylineRoutes`. A turn
that is never recorded (a failed request, an abandoned stream) changes nothing the next turn
relies on: the server checks the base each request names, and reports a mismatch as a fallback.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import openai

from leyline_sdk import session_ops
from leyline_sdk.blocks import Blocks, block_fingerprint, place_blocks, strip_block_marks, with_repair
from leyline_sdk.diff import diff_to_directives
from leyline_sdk.directives import Directive, Mode, apply, digest
from leyline_sdk.edits import Edit
from leyline_sdk.fallback import SpliceFallbackError
from leyline_sdk.gateway import Gateway
from leyline_sdk.policy_run import EditReport, run_policies
from leyline_sdk.renderer import Renderer
from leyline_sdk.rendering import RenderedConversation
from leyline_sdk.routes import LeylineRoutes
from leyline_sdk.stats import TurnStats, _Turn
from leyline_sdk.templates import Source
from leyline_sdk.turns import decoder_of, explain_turn, local_chat, render_tokens, seen_view
from leyline_sdk.validation import check_messages, check_tools
from leyline_sdk.wire import BaseRef, LeylineRequest, LeylineResult

__all__ = ["LeylineSession", "TurnStats"]


class LeylineSession:
    """A conversation with the server; see the module docstring for the protocol.

    ``routes`` reaches Leyline's routes, ``renderer`` renders prompts as the server does (and
    says whether it speaks Leyline); ``on_use`` is called on every request (the client's LRU).
    ``seam_repair=k`` asks the server to recompute the first ``k`` tokens after each ``amortize``
    replacement (and a placed block's first ``k``); ``blocks`` is the client's block registry;
    ``send`` is how :meth:`create` sends a turn (the client's ``chat.completions`` for this
    session). Normally made by ``AsyncLeyline.session()``.
    """

    def __init__(
        self,
        routes: LeylineRoutes,
        renderer: Renderer,
        policies: Sequence[Any] = (),
        strict: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        on_use: Callable[[LeylineSession], None] | None = None,
        seam_repair: int = 4,
        blocks: Blocks | None = None,
        send: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        if isinstance(seam_repair, bool) or not isinstance(seam_repair, int) or seam_repair < 0:
            raise ValueError(f"seam_repair must be an int >= 0, got {seam_repair!r}")
        self.seam_repair = seam_repair
        self.blocks = blocks if blocks is not None else Blocks(routes)
        self._block_prints: set[str] = set()
        self._block_indices: set[int] = set()  # effective indices of block messages (this turn)
        self.routes = routes
        self._send = send
        self.renderer = renderer
        self.policies = list(policies)
        self.strict = strict
        self.tools = check_tools(tools)
        self.history: list[dict[str, Any]] = []
        self.effective: list[dict[str, Any]] = []
        self.sticky: dict[int, Edit] = {}
        self.session_id: str | None = None
        self.base_tokens: list[int] | None = None
        self.stats: list[TurnStats] = []
        self.last_directives: list[Directive] = []  # what the last request sent (for inspection)
        self._base_digest: str | None = None
        self._seen: list[dict[str, Any]] = []  # effective messages the server has (the base's prompt part)
        self._seen_render: RenderedConversation | None = None
        self._fallback_code: str | None = None
        self._unedited: list[int] | None = None  # see _render_unedited
        self._turn_sources: list[Source] = []
        self._pending_modes: dict[int, Mode] = {}  # edits sync_edits left to the next request
        self._unrecorded: _Turn | None = None  # a turn sent with the extension, not recorded yet
        self._abandoned: list[str] = []  # server sessions a strict refusal left, to delete
        self._on_use = on_use
        self.routing_key = f"leyline-{uuid.uuid4().hex}"  # its routing header's value behind a gateway

    @property
    def gateway(self) -> Gateway | None:
        """The gateway this session's requests pass (``leyline_sdk.gateway``), else ``None``."""
        probe = getattr(self.renderer, "probe", None)
        return getattr(probe, "gateway", None)

    # -- state ------------------------------------------------------------------------------------
    def _adopt(
        self, base: list[int], base_digest: str, seen: list[dict[str, Any]], render: RenderedConversation
    ) -> None:
        self.base_tokens, self._base_digest, self._seen, self._seen_render = base, base_digest, seen, render

    def _forget_base(self) -> None:
        self.base_tokens, self._base_digest, self._seen, self._seen_render = None, None, [], None

    def _fallback(self, code: str, message: str) -> None:
        if self.strict:
            raise SpliceFallbackError(code, message)
        self._fallback_code = code

    # -- policies and directives ------------------------------------------------------------------
    def _run_policies(
        self, tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], dict[int, Mode], EditReport]:
        effective, edits, report = run_policies(self.history, self.policies, tools, sticky=self.sticky)
        self.sticky = edits
        effective, self._block_indices = strip_block_marks(effective, self._block_prints)
        self.effective = effective
        return effective, report.modes(), report  # by effective index: errata shift later messages

    def _directives(
        self, effective: list[dict[str, Any]], prompt: RenderedConversation, modes: Mapping[int, Mode], turn: bool
    ) -> tuple[list[Directive], RenderedConversation] | None:
        """Directives turning the base into a prefix of ``prompt``, and the seen messages' new rendering.

        ``turn``: ``prompt`` is the next request's (its generated part is checked and, where it
        differs from the re-rendered assistant message, dropped in ``forget`` mode); otherwise only
        the seen messages are edited (``sync_edits``). ``None``: send none (forget).
        """
        base, old, k = self.base_tokens, self._seen_render, len(self._seen)
        if base is None or old is None:
            self._fallback("base_mismatch", "the client does not know the server's base")
            return None
        if min(len(effective), len(prompt.message_spans)) < k or any(
            a.get("role") != b.get("role") for a, b in zip(effective, self._seen, strict=False)
        ):
            self._fallback("prompt_mismatch", "the agent rewrote messages the server has seen")
            return None
        seen = seen_view(prompt, k, old)
        if turn:  # the template's own edits too (dropped reasoning, a re-rendered answer): turns.py
            directives = self._explain_turn(effective, prompt, modes)
            result = apply(base, directives)
            ok = len(result) <= len(prompt.tokens) and prompt.tokens[: len(result)] == result
        elif not (old.prefix_stable and prompt.prefix_stable):
            self._pending_modes.update(modes)  # spans of an unstable render are approximate:
            return None  # the next request explains these edits, in their modes
        else:
            directives = diff_to_directives(old, seen, modes=dict(modes))
            result = apply(base, directives)
            ok = result[: len(seen.tokens)] == seen.tokens
        if not ok:
            self._fallback("prompt_mismatch", "directives do not reproduce the prompt")  # never send those
            return None
        return directives, seen

    def _explain_turn(
        self, effective: list[dict[str, Any]], prompt: RenderedConversation, modes: Mapping[int, Mode]
    ) -> list[Directive]:
        """The next request's directives, the chat template's own edits included (``leyline_sdk.turns``)."""
        assert self.base_tokens is not None and self._seen_render is not None
        k = len(self._seen)
        modes, self._pending_modes = {**self._pending_modes, **modes}, {}
        changed = {
            i: (modes.get(i, Mode.AMORTIZE), Source.POLICY if i in modes else Source.CLIENT)
            for i in range(k)
            if effective[i] != self._seen[i]
        }
        unedited = self._unedited
        explained = explain_turn(
            self.base_tokens,
            self._seen_render,
            prompt,
            k,
            changed,
            (lambda: unedited) if unedited is not None else None,
            decoder_of(local_chat(self.renderer)),
        )
        self._turn_sources = explained.sources
        return explained.directives

    async def _render_unedited(
        self, effective: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> None:
        """On an unstable template, render the prompt without this turn's edits of seen messages.

        ``turns.explain_turn`` tells the template's edits from the policies' with it (the message
        spans of an unstable rendering are approximate). Nothing to do otherwise.
        """
        self._unedited, self._turn_sources = None, []
        old, k = self._seen_render, len(self._seen)
        if old is None or old.prefix_stable or len(effective) < k or effective[:k] == self._seen:
            return
        self._unedited = await render_tokens(self.renderer, self._seen + effective[k:], tools)

    # -- requests ---------------------------------------------------------------------------------
    async def _prepare(self, tools: Sequence[Mapping[str, Any]] | None) -> _Turn:
        self._fallback_code = None
        self.last_directives = []
        effective, modes, report = self._run_policies(tools)
        prompt = await self.renderer.render(effective, tools)
        turn = _Turn(effective, prompt, report)
        if prompt is None:  # the server does not speak Leyline: plain requests
            return turn
        turn.extension = LeylineRequest(session_id=self.session_id, strict=self.strict)
        if self.session_id is not None:
            await self._render_unedited(effective, tools)
            planned = self._directives(effective, prompt, modes, turn=True)
            turn.sources = list(self._turn_sources) if planned else []
            directives = await self._with_blocks(planned[0], prompt, turn) if planned else []
            if directives:
                assert self.base_tokens is not None
                self.last_directives = directives
                turn.extension.base = BaseRef(length=len(self.base_tokens), digest=self._base_digest)
                turn.extension.directives = directives
        elif self._block_indices:
            turn.block_fallback = "no_base"  # a new session has no base to insert a block into
        turn.fallback = self._fallback_code
        return turn

    async def _with_blocks(
        self, directives: list[Directive], prompt: RenderedConversation, turn: _Turn
    ) -> list[Directive]:
        """``directives`` with ``seam_repair`` on the amortize ones, plus the new block messages placed."""
        assert self.base_tokens is not None
        directives = with_repair(directives, self.seam_repair)
        if not self._block_indices:
            return directives
        if self.gateway is not None:  # /leyline/blocks is out of reach: the block message is prefilled
            turn.block_fallback = "gateway"
            return directives
        k = len(self._seen)  # new block messages come after the messages the server has seen
        floor = prompt.message_spans[k - 1].end if k else 0
        placement = await place_blocks(
            self.blocks, self.base_tokens, directives, prompt, self._block_indices, self.seam_repair, floor
        )
        turn.block_ids, turn.block_fallback = tuple(placement.block_ids), placement.reason
        return placement.directives

    def add_block_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Append ``message`` to the history as a block message (see ``leyline_sdk.blocks``); return it.

        Any message equal to it (tool instructions, a skill, a document) is a block message from
        now on; the marker ``"leyline_block": True`` on a message does the same for that message.
        """
        (clean,) = strip_block_marks(check_messages([message]))[0]
        self._block_prints.add(block_fingerprint(clean))
        self.history.append(clean)
        return clean

    async def prepare(self, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> _Turn:
        """Adopt ``messages`` (the full history, as ``check_messages`` returns it) and prepare the next request.

        Runs the policies, renders, and returns the turn: ``turn.effective`` is what the request
        sends as ``messages``, ``turn.extension`` its ``leyline`` field (``None`` against a server
        without Leyline). Hand the response to :meth:`record`.
        """
        started = time.perf_counter()
        self.history = messages
        if self._on_use is not None:
            self._on_use(self)
        while self._abandoned and self.gateway is None:
            await session_ops.delete(self.routes, self._abandoned.pop(), quiet=True)
        if self._unrecorded is not None:
            sent, self._unrecorded = self._unrecorded, None
            if self.gateway is None:
                await session_ops.resync(self, sent)
            else:  # the session route is out of reach: the next request sends no directives
                self._forget_base()
        turn = await self._prepare(tools)
        turn.started = started
        self._unrecorded = turn if turn.extension is not None else None
        return turn

    def record(self, turn: _Turn, leyline: Mapping[str, Any] | None, usage: Any, completion: Any = None) -> None:
        """Stats of a finished request; adopt the server's session and base when they check out.

        ``leyline`` is the response's ``leyline`` field (a stream's last one), ``usage`` its
        usage, ``completion`` the response itself (carried by a strict session's error).
        """
        stats = TurnStats(
            turn=len(self.stats) + 1,
            cleared=len(turn.report.cleared),
            removed_chars=turn.report.removed_chars,
            directives=len(turn.extension.directives) if turn.extension else 0,
            fallback=turn.fallback,
            blocks=len(turn.block_ids),
            block_fallback=turn.block_fallback,
        )
        stats.attribute(turn.sources)
        if usage is not None:
            stats.prompt_tokens = usage.prompt_tokens
            details = getattr(usage, "prompt_tokens_details", None)
            stats.cached_tokens = getattr(details, "cached_tokens", 0) or 0
        result = LeylineResult.model_validate(leyline) if leyline is not None else None
        if result is not None and turn.prompt is not None:
            self._adopt_result(turn, result, stats)
        stats.elapsed_ms = (time.perf_counter() - turn.started) * 1e3
        self.stats.append(stats)
        if self._unrecorded is turn:
            self._unrecorded = None
        if self.strict and result is not None and result.fallback is not None:
            raise SpliceFallbackError(result.fallback.code, result.fallback.message, completion)

    def _adopt_result(self, turn: _Turn, result: LeylineResult, stats: TurnStats) -> None:
        """Count the server's tokens; adopt its session id and the new base if our tokens agree."""
        assert turn.prompt is not None
        stats.count(result)
        stats.fallback = result.fallback.code if result.fallback else stats.fallback
        if result.fallback is not None and turn.block_ids:  # verify those blocks before reusing them
            self.blocks.suspect(turn.block_ids)
        self.session_id = result.session_id or self.session_id
        tokens = turn.prompt.tokens + result.completion_token_ids
        server_digest = result.base.digest if result.base else None
        if server_digest is not None and server_digest == digest(tokens):
            self._adopt(tokens, server_digest, list(turn.effective), turn.prompt)
        else:  # our rendering disagrees with the server's: no directives until it agrees again
            self._forget_base()
            stats.fallback = stats.fallback or "tokenizer_mismatch"

    def refused(self, exc: openai.APIStatusError) -> Exception:
        """What to raise for an error answer to this session's request (``session_ops.refused``)."""
        return session_ops.refused(self, exc)

    async def sync_edits(self, tools: Sequence[Mapping[str, Any]] | None = None) -> TurnStats | None:
        """Run the policies now and splice the server's cache without generating (while a tool runs).

        Returns the stats of the splice, or ``None`` when there is nothing to send. A server that
        no longer knows the session is reported as ``fallback == "session_not_found"``; the next
        ``create`` then opens a new one. Behind a gateway (``self.gateway``) nothing is sent: the
        next turn carries these edits as directives.
        """
        return await session_ops.splice_now(self, tools)

    async def create(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Send the (full) history in this session: ``client.chat.completions.create``'s arguments
        and return value (a ``ChatCompletion`` with ``.leyline``, or openai's ``AsyncStream``).

        ``messages=None`` resends the session's history (e.g. after ``session.history.append``);
        ``tools=None`` sends the session's tools.
        """
        if self._send is None:
            raise TypeError("this session belongs to a blocking client: use the session Leyline.session() returned")
        return await self._send(self, model=model, messages=messages, tools=tools, stream=stream, **kwargs)

    # -- lookup and lifetime ----------------------------------------------------------------------
    def matches(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Length of the history prefix ``messages`` shares with this session (0 if it diverges)."""
        n = len(self.history)
        if n == 0 or len(messages) < n or messages[n - 1] != self.history[-1]:
            return 0
        return n if all(a == b for a, b in zip(messages, self.history, strict=False)) else 0

    async def aclose(self) -> None:
        """Delete the server-side session (a cache handle; a 404 is fine) and forget its base.

        Behind a gateway the delete route is out of reach: the server's idle limit drops it.
        """
        session_id, self.session_id = self.session_id, None
        self._forget_base()
        if session_id is not None and self.gateway is None:
            await session_ops.delete(self.routes, session_id)

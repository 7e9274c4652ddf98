"""LeylineSession: one conversation, its policies, and the directives that keep the server's cache in sync.

A session's state has three homes: the agent's conversation (:class:`~leyline_sdk.session.history.History`:
the full history, never changed, and the effective one the model sees), what the client believes
the server holds (:class:`~leyline_sdk.session.server_view.ServerView`: session id, base, the
messages it was rendered from) and, for one request, the turn being prepared
(:class:`~leyline_sdk.session.turn.PreparedTurn`). Each turn the session

1. runs the policies over the full history (earlier edits are sticky);
2. renders the effective history once (its :class:`~leyline_sdk.session.renderer.Renderer`: a
   local tokenizer, incrementally, or one ``/leyline/tokenize`` round trip);
3. plans the directives (:mod:`leyline_sdk.session.planner`): the seen messages' edits, each in
   its edit's mode, the template's own edits, the generated answer checked against its re-render,
   all verified locally (``apply(base, D)`` is a prefix of the new prompt);
4. sends them with the base's length and digest; :meth:`record` adopts the server's answer.

:meth:`LeylineSession.sync_edits` plans and sends the seen messages' edits without generating
(splice while a tool runs). Anything that does not check out sends no directives: the server's
prefix cache then re-prefills from the first difference — that is ``forget``, never a wrong
cache — and ``TurnStats.fallback`` says why (:mod:`leyline_sdk.core.fallbacks`). ``strict=True``
raises instead (and asks the server to be strict too). A server that dropped the session answers
with a new ``session_id`` (``fallback == "base_mismatch"``); the session adopts it.

The session sends no turn itself: :meth:`prepare` returns the request and the client's
``chat.completions`` sends it with openai's own ``create``, then hands the response (or the end
of the stream) to :meth:`record`. Its other requests go through the client's
:class:`~leyline_sdk.session.port.LeylineRoutes` (:mod:`leyline_sdk.session.ops`). A turn that is
never recorded changes nothing the next turn relies on: the server checks the base each request
names, and reports a mismatch as a fallback.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from leyline_sdk.core.directives import Directive
from leyline_sdk.core.fallbacks import BlockFallback, FallbackCode
from leyline_sdk.core.validation import check_tools
from leyline_sdk.core.wire import LeylineRequest
from leyline_sdk.explain.turns import decoder_of, local_chat
from leyline_sdk.session import ops
from leyline_sdk.session.blocks import Blocks, place_blocks, with_repair
from leyline_sdk.session.gateway import Gateway
from leyline_sdk.session.history import History
from leyline_sdk.session.planner import CLIENT_EDITS, ClientEdits, Plan, Unplanned, turn_plan, unedited_render
from leyline_sdk.session.port import LeylineRoutes
from leyline_sdk.session.record import record_turn
from leyline_sdk.session.renderer import Renderer
from leyline_sdk.session.server_view import ServerView
from leyline_sdk.session.stats import TurnStats
from leyline_sdk.session.turn import PreparedTurn

__all__ = ["LeylineSession", "TurnStats"]


class LeylineSession:
    """A conversation with the server; see the module docstring for the protocol.

    ``routes`` reaches Leyline's routes, ``renderer`` renders prompts as the server does (and
    says whether it speaks Leyline); ``on_use`` is called on every request (the client's LRU).
    ``seam_repair=k`` asks the server to recompute the first ``k`` tokens after each ``amortize``
    replacement (and a placed block's first ``k``); ``blocks`` is the client's block registry;
    ``send`` is how :meth:`create` sends a turn (the client's ``chat.completions`` for this
    session); ``client_edits`` is the mode of the agent's own edits of its history
    (:mod:`leyline_sdk.session.planner`). Normally made by ``AsyncLeyline.session()``.

    State: ``conversation`` (the agent's histories), ``server`` (what the server holds),
    ``stats`` (one :class:`TurnStats` per request), ``last_directives`` (what the last request
    sent). ``history``, ``effective``, ``session_id`` and ``base_tokens`` read them.
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
        client_edits: ClientEdits = "auto",
    ) -> None:
        if isinstance(seam_repair, bool) or not isinstance(seam_repair, int) or seam_repair < 0:
            raise ValueError(f"seam_repair must be an int >= 0, got {seam_repair!r}")
        self.policies = list(policies)
        self.strict = strict
        self.tools = check_tools(tools)
        if client_edits not in CLIENT_EDITS:
            raise ValueError(f"client_edits must be one of {', '.join(CLIENT_EDITS)}, got {client_edits!r}")
        self.seam_repair = seam_repair
        self.client_edits: ClientEdits = client_edits
        self.conversation = History()
        self.server = ServerView()
        self.stats: list[TurnStats] = []
        self.last_directives: list[Directive] = []
        self.routes = routes
        self.renderer = renderer
        self.blocks = blocks if blocks is not None else Blocks(routes)
        self.routing_key = f"leyline-{uuid.uuid4().hex}"  # its routing header's value behind a gateway
        self.cache_key: str | None = None  # the prompt_cache_key its calls send, if any (how it is found)
        self._send = send
        self._on_use = on_use

    # -- views of the state -----------------------------------------------------------------------
    @property
    def history(self) -> list[dict[str, Any]]:
        """The full history the agent wrote (never changed by Leyline)."""
        return self.conversation.full

    @history.setter
    def history(self, messages: list[dict[str, Any]]) -> None:
        self.conversation.full = messages

    @property
    def effective(self) -> list[dict[str, Any]]:
        """The effective history of the last turn: what the model saw, after the policies."""
        return self.conversation.effective

    @property
    def session_id(self) -> str | None:
        """The server's session id (``None`` until the first answer)."""
        return self.server.session_id

    @property
    def base_tokens(self) -> list[int] | None:
        """The server's base as the client knows it (``None``: unknown)."""
        return self.server.base_tokens

    @property
    def gateway(self) -> Gateway | None:
        """The gateway this session's requests pass (``leyline_sdk.session.gateway``), else ``None``."""
        probe = getattr(self.renderer, "probe", None)
        return getattr(probe, "gateway", None)

    def touch(self) -> None:
        """Tell the client's registry this session was just used."""
        if self._on_use is not None:
            self._on_use(self)

    def fallback(self, turn: PreparedTurn | None, code: FallbackCode, message: str) -> None:
        """No directives this turn because of ``code``: raise when strict, else record it on ``turn``."""
        if self.strict:
            raise self.routes.fallback_error(code.value, message)
        if turn is not None:
            turn.fallback = code.value

    # -- a turn -----------------------------------------------------------------------------------
    async def prepare(self, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> PreparedTurn:
        """Adopt ``messages`` (the full history, as ``check_messages`` returns it) and prepare the next request.

        Runs the policies, renders, and returns the turn: ``turn.effective`` is what the request
        sends as ``messages``, ``turn.extension`` its ``leyline`` field (``None`` against a server
        without Leyline). Hand the response to :meth:`record`.
        """
        started = time.perf_counter()
        self.conversation.adopt(messages)
        self.touch()
        await ops.settle(self)
        self.last_directives = []
        passed = self.conversation.apply_policies(self.policies, tools)
        prompt = await self.renderer.render(passed.effective, tools)
        turn = PreparedTurn(passed.effective, prompt, passed.report, started, modes=passed.modes)
        turn.block_indices = passed.block_indices
        if prompt is not None:  # else the server does not speak Leyline: plain requests
            await self._extend(turn, tools)
        self.server.unrecorded = turn if turn.extension is not None else None
        turn.prepared = time.perf_counter()
        return turn

    async def _extend(self, turn: PreparedTurn, tools: Sequence[Mapping[str, Any]] | None) -> None:
        """The turn's ``leyline`` extension: the session, and the directives when they check out."""
        turn.extension = LeylineRequest(session_id=self.server.session_id, strict=self.strict)
        if self.server.session_id is None:
            if turn.block_indices:
                turn.block_fallback = BlockFallback.NO_BASE.value
            return
        assert turn.prompt is not None
        turn.unedited = await unedited_render(self.server, turn.effective, tools, self.renderer)
        try:
            plan = turn_plan(
                self.server,
                turn.effective,
                turn.prompt,
                turn.modes,
                turn.unedited,
                decoder_of(local_chat(self.renderer)),
            )
        except Unplanned as why:
            self.fallback(turn, why.code, why.message)
            return
        turn.sources = plan.sources
        directives = await self._with_blocks(plan, turn)
        if directives:
            self.last_directives = directives
            turn.extension.base = self.server.base_ref()
            turn.extension.directives = directives

    async def _with_blocks(self, plan: Plan, turn: PreparedTurn) -> list[Directive]:
        """The plan's directives with ``seam_repair`` on the amortize ones, plus the new block messages placed."""
        assert self.server.base_tokens is not None and turn.prompt is not None
        directives = with_repair(plan.directives, self.seam_repair)
        if not turn.block_indices:
            return directives
        if self.gateway is not None:  # /leyline/blocks is out of reach: the block message is prefilled
            turn.block_fallback = BlockFallback.GATEWAY.value
            return directives
        k = len(self.server.seen)  # new block messages come after the messages the server has seen
        floor = turn.prompt.message_spans[k - 1].end if k else 0
        placement = await place_blocks(
            self.blocks, self.server.base_tokens, directives, turn.prompt, turn.block_indices, self.seam_repair, floor
        )
        turn.block_ids, turn.block_fallback = tuple(placement.block_ids), placement.reason
        return placement.directives

    def add_block_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Append ``message`` to the history as a block message (see ``leyline_sdk.session.blocks``); return it.

        Any message equal to it (tool instructions, a skill, a document) is a block message from
        now on; the marker ``"leyline_block": True`` on a message does the same for that message.
        """
        return self.conversation.add_block_message(message)

    def record(
        self,
        turn: PreparedTurn,
        leyline: Mapping[str, Any] | None,
        usage: Any,
        completion: Any = None,
        reply: Mapping[str, Any] | None = None,
    ) -> TurnStats:
        """Read a finished request's answer (:func:`~leyline_sdk.session.record.record_turn`)."""
        return record_turn(self, turn, leyline, usage, completion, reply)

    async def sync_edits(self, tools: Sequence[Mapping[str, Any]] | None = None) -> TurnStats | None:
        """Run the policies now and splice the server's cache without generating (while a tool runs).

        Returns the stats of the splice, or ``None`` when there is nothing to send. A server that
        no longer knows the session is reported as ``fallback == "session_not_found"``; the next
        ``create`` then opens a new one. Behind a gateway (``self.gateway``) nothing is sent: the
        next turn carries these edits as directives.
        """
        return await ops.splice_now(self, tools)

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
        history = self.conversation.full
        n = len(history)
        if n == 0 or len(messages) < n or messages[n - 1] != history[-1]:
            return 0
        return n if all(a == b for a, b in zip(messages, history, strict=False)) else 0

    async def aclose(self) -> None:
        """Delete the server-side session (a cache handle; a 404 is fine) and forget its base.

        Behind a gateway the delete route is out of reach: the server's idle limit drops it.
        """
        session_id = self.server.session_id
        self.server.lose_session()
        if session_id is not None and self.gateway is None:
            await ops.delete(self.routes, session_id)

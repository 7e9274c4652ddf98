"""One chat turn, one pipeline: every wire protocol feeds it a conversation and reads back its result.

A route parses its protocol's request into a :class:`~leyline_server.api.schemas.ChatCompletionRequest`
(the conversation: messages, tools, sampling, constraint, the ``leyline`` extension) and calls
:meth:`ChatPipeline.prepare`; the turn's steps run in this order, each one bounded before the
next starts:

1. **check** — model, fields, content, tools (cheap, before anything is admitted);
2. **admit** — a slot of the key's share (:mod:`.admission`);
3. **render** — the prompt, off the event loop, and for a plain client the conversation it
   continues, even after the client edited it (:mod:`.render`, :mod:`.conversations`); then the
   length check (prompt + completion within the context);
4. **constrain** — the output constraint: its schemas within the request's budget
   (:mod:`.schema_budget`), then validated and turned into grammars off the event loop (a bad one
   is a 400 naming its field); its compile starts here, one in flight per key (:mod:`.compiles`),
   and runs beside the prefill;
5. **choose the session** — the extension's, the recognised conversation's, or none (a plain
   request: the prefix cache alone) (:mod:`.session_choice`);
6. **reserve** — the turn's KV on the admission ticket: the prompt and a bounded headroom, grown
   as tokens are generated (:mod:`.room`); a session's splice checked (a strict one that cannot
   apply is its 4xx now) and the old base's KV reserved;
7. **splice + prefill** — one engine job (``Engine.start_turn``); then the wait for the
   constraint's compile, within ``--compile-timeout`` (a stream's opening never waits for it:
   Claude Code's 24 tools take ~9 s to compile on a CPU).

:meth:`ChatPipeline.prepare` runs steps 1–6, everything that can fail with an HTTP error, and
returns a :class:`PreparedTurn`: the route can start its answer then (a stream's opening events
go out at once). :meth:`PreparedTurn.prefill` runs step 7 as a task (a long prompt takes minutes
on a CPU); cancelled — its client left — the engine gives the prefill up at its next chunk. It
returns an :class:`OpenTurn`, from which the route reads:

8. **decode** — :meth:`OpenTurn.deltas` (text as it becomes safe to show, logprobs), then
   :attr:`OpenTurn.outcome` (the message, its tool calls, the finish reason);
9. **report** — :meth:`OpenTurn.result` (the ``leyline`` field), :meth:`OpenTurn.usage`,
   :meth:`OpenTurn.headers` (the same facts as headers, on a whole answer; a stream's headers are
   :meth:`PreparedTurn.headers`, what is known before step 7).

:meth:`PreparedTurn.close` (:meth:`OpenTurn.close` once prefilled) keeps or releases what the turn
holds (the session's new base, the admission slot and its reservation); the answer scaffolding
(:mod:`.answer`) calls it however the answer ends (a streamed one: when the stream closes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from leyline_server.api.admission import Ticket
from leyline_server.api.client_edits import client_edits_mode
from leyline_server.api.compiles import Compiling
from leyline_server.api.constraints import plan_constraint
from leyline_server.api.conversations import hints_of
from leyline_server.api.decoder import TextDecoder
from leyline_server.api.open_turn import Delta, OpenTurn
from leyline_server.api.params import check_request, sampling_params, stop_strings
from leyline_server.api.prompting import prompt_shape
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.api.service import ChatTurn, LeylineService, Prompt
from leyline_server.api.session_choice import choose_session, held_session
from leyline_server.api.timings import Clock
from leyline_server.api.tools import ToolPlan, plan_tools
from leyline_server.contract.values import (
    PrefillProgress,
    SamplingParams,
)
from leyline_server.sessions import Session

__all__ = ["ChatPipeline", "PreparedTurn", "OpenTurn", "Delta"]

Start = Callable[[PrefillProgress], Awaitable[ChatTurn]]  # step 7 of a prepared turn


@dataclass
class PreparedTurn:
    """A turn admitted, rendered, checked, its session held and its KV reserved: steps 1–6 of the
    module docstring, nothing computed yet. :meth:`prefill` runs step 7; :meth:`close` releases
    what the turn holds, whether it was prefilled, is prefilling (the prefill is cancelled) or not.
    """

    service: LeylineService
    owner: str | None
    session: Session | None
    begin: Start
    params: SamplingParams
    decoder: TextDecoder
    stack: AsyncExitStack
    prompt_tokens: int
    capped_to: int | None = None
    clock: Clock = field(default_factory=Clock)
    progress: PrefillProgress = field(default_factory=PrefillProgress)
    ticket: Ticket | None = None  # the admission ticket the turn's KV is reserved on
    granted: int = 0  # completion tokens reserved at admission (:attr:`OpenTurn.granted`)
    compiling: Compiling | None = None  # the constraint's compile, started at step 4
    _task: asyncio.Task[OpenTurn] | None = field(default=None, repr=False)
    _turn: OpenTurn | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.progress.total = self.prompt_tokens

    @property
    def ended(self) -> asyncio.Event | None:
        """Set when the turn's session is deleted (``None``: no session); see :attr:`OpenTurn.ended`."""
        return self.session.ended if self.session is not None else None

    def headers(self) -> dict[str, str]:
        """What is known of the turn before its prefill, as headers (a stream's): its session, the cap."""
        out = {"x-leyline-session": self.session.id} if self.session is not None else {}
        if self.capped_to is not None:
            out["x-leyline-max-tokens-capped"] = str(self.capped_to)
        return out

    def prefill(self) -> asyncio.Task[OpenTurn]:
        """Step 7, splice and prefill, as a task (started by the first call): the turn ready to decode.

        Cancelling it — directly, or by cancelling a task that awaits it — gives the prefill up at
        the engine's next chunk and releases what it computed; :meth:`close` does so too.
        """
        if self._task is None:
            self._task = asyncio.ensure_future(self._prefill())
        return self._task

    async def _prefill(self) -> OpenTurn:
        chat = await self.begin(self.progress)  # 7. splice + prefill
        self.clock.mark("turn")
        if self.compiling is not None:  # the grammar compiled beside the prefill (failed: close() releases)
            await self.compiling.done()
        self.clock.mark("compile")
        chat.timings = self.clock.turn_timings(chat.turn.timings)
        self._turn = OpenTurn(self.service, chat, self.params, self.decoder, self.stack, capped_to=self.capped_to,
                              clock=self.clock, ticket=self.ticket, granted=self.granted)  # fmt: skip
        return self._turn

    @property
    def abandoned(self) -> bool:
        """Whether the prefill began and did not end (it is running, or was cancelled)."""
        task = self._task
        return task is not None and (not task.done() or task.cancelled())

    async def close(self) -> None:
        """Cancel a prefill in flight (and wait for it to let go), then release what the turn holds:
        :meth:`OpenTurn.close` once prefilled, else the admission slot, the reservation and the session."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.wait({task})  # cancelled or failed: its outcome is the awaiter's to report
        if self._turn is not None:
            await self._turn.close()
        else:
            await self.stack.aclose()
            self.service.room.fit()  # the session it leaves idle must fit beside the reservations


def _capped(req: ChatCompletionRequest, prompt_tokens: int, context: int) -> int | None:
    """The room left in the context when ``req`` asks for more (and there is room), else ``None``."""
    asked, room = req.max_completion_tokens or req.max_tokens, context - prompt_tokens
    return room if asked is not None and room >= 1 and asked > room else None


class ChatPipeline:
    """The one chat turn (see the module docstring); every protocol's route calls :meth:`open`."""

    def __init__(self, service: LeylineService) -> None:
        self.service = service

    async def prepare(
        self,
        req: ChatCompletionRequest,
        owner: str | None,
        client_edits: str | None = None,
        recognise: bool = False,
        cap_max_tokens: bool = False,
    ) -> PreparedTurn:
        """Steps 1–6 for ``req`` on behalf of ``owner``: the turn, ready to prefill (close it).

        Every HTTP error of the turn is raised here, before an answer starts (step 7's own
        failures — the pool full, a strict splice the engine refuses — are the exceptions).
        ``client_edits``: the request's ``X-Leyline-Client-Edits`` header; ``recognise``: continue
        the conversation's session even without ``--auto-splice`` or the opt-in (the Responses and
        Messages APIs: a conversation protocol), exactly (:mod:`.conversations`);
        ``cap_max_tokens``: a completion limit past the room left in the context is capped to
        the room (:attr:`PreparedTurn.capped_to`) instead of a 400 (the Messages API: Claude Code
        asks for 32,000 whatever the model).
        """
        service = self.service
        clock = Clock()
        tools = self._check(req)  # 1. check
        shape = prompt_shape(service.chat, req)
        mode = client_edits_mode(client_edits, service.config.client_edits)
        stack = AsyncExitStack()
        try:
            ticket = await stack.enter_async_context(service.admission.slot(owner))  # 2. admit
            clock.mark("admit")
            hints = hints_of(req)
            prompt = await service.prompt(owner, req.messages, req.tools, req.leyline, shape, hints, mode, recognise)
            clock.mark("render")
            capped = _capped(req, len(prompt.tokens), service.context_tokens) if cap_max_tokens else None
            if capped is not None:
                req = req.model_copy(update={"max_tokens": capped, "max_completion_tokens": None})
            params = self._sampling(req, prompt)  # 3. the length check
            compiling = await self._constrain(req, tools, owner)  # 4. constrain (the compile starts)
            params.constraint = compiling.constraint if compiling is not None else None
            clock.mark("constrain")
            decoder = self._decoder(req, params, tools)
            granted = service.room.headroom(params.max_tokens)
            session, begin = await self._hold(stack, req, owner, prompt, ticket, granted)  # 5.–6.
        except BaseException:
            await stack.aclose()
            raise
        return PreparedTurn(service, owner, session, begin, params, decoder, stack, len(prompt.tokens),
                            capped_to=capped, clock=clock, ticket=ticket, granted=granted,
                            compiling=compiling)  # fmt: skip

    async def count_tokens(self, req: ChatCompletionRequest, owner: str | None) -> int:
        """The length of ``req``'s prompt (one render, no turn)."""
        service = self.service
        tokens = await service.render.tokens(owner, req.messages, req.tools, True, prompt_shape(service.chat, req))
        return len(tokens)

    async def fits(self, req: ChatCompletionRequest, owner: str | None) -> bool:
        """Whether ``req``'s prompt leaves room in the context for its completion (one render, no turn)."""
        asked = req.max_completion_tokens or req.max_tokens or 1
        return await self.count_tokens(req, owner) + asked <= self.service.context_tokens

    def _check(self, req: ChatCompletionRequest) -> ToolPlan:
        self.service.check_model(req.model)
        self.service.render.check(req.messages, req.tools)  # the message count first, then content, characters
        check_request(req)
        return plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)

    async def _constrain(self, req: ChatCompletionRequest, tools: ToolPlan, owner: str | None) -> Compiling | None:
        """The output constraint, planned here so that a bad one is a 400 naming its field; its
        compile starts here and is waited for after the prefill (:class:`~.compiles.Compiling`).

        Planning charges the schemas to the request's budget, then validates them and turns them
        into grammars (jsonschema: seconds for a megabyte of ``$defs``), so it runs off the event
        loop; the compile goes through the key's turn at the compile gate.
        """
        chat = self.service.chat
        plan = await asyncio.to_thread(plan_constraint, chat, tools, req.response_format, req.regex, req.ebnf)
        if plan is None:
            return None
        gate = self.service.compiles
        return Compiling(gate, gate.start(owner, plan.constraint), plan.constraint, plan.param)

    def _sampling(self, req: ChatCompletionRequest, prompt: Prompt) -> SamplingParams:
        service = self.service
        vocab = service.engine.info.vocab_size
        params = sampling_params(
            req, len(prompt.tokens), service.context_tokens, vocab, defaults=service.config.sampling
        )
        if req.max_tokens is None and req.max_completion_tokens is None and service.config.default_max_tokens:
            params.max_tokens = min(params.max_tokens, service.config.default_max_tokens)
        return params

    def _decoder(self, req: ChatCompletionRequest, params: SamplingParams, tools: ToolPlan) -> TextDecoder:
        service = self.service
        eos = () if params.ignore_eos else service.engine.info.eos_token_ids
        return TextDecoder(
            service.tokenizer,
            [*eos, *params.stop_token_ids],
            stop_strings(req),
            parse_tools=tools.parse,
            parallel=tools.parallel,
            tool_names=tools.names,
            skip_special=req.skip_special_tokens is not False,
            keep_stop=bool(req.no_stop_trim),
        )

    async def _hold(
        self,
        stack: AsyncExitStack,
        req: ChatCompletionRequest,
        owner: str | None,
        prompt: Prompt,
        ticket: Ticket,
        completion: int,
    ) -> tuple[Session | None, Start]:
        """Steps 5–6: choose and hold the session, reserve the KV (the prompt and ``completion``
        tokens); the session, and step 7 (splice and prefill) to run later. What to undo goes on
        ``stack``."""
        service, ext = self.service, req.leyline
        choice = choose_session(service, ext, owner, prompt)  # 5. choose the session
        await service.room.reserve(ticket, len(prompt.tokens) + completion, keep=choice.keep)  # 6. reserve
        if choice.plain:

            async def plain(progress: PrefillProgress) -> ChatTurn:
                chat = await service.start_plain(prompt.tokens, owner, progress)  # 7. (the prefix cache alone)
                stack.callback(lambda: service.engine.release(chat.turn.handle))
                return chat

            return None, plain
        session, named = await held_session(service, stack, choice, ext, owner, prompt)
        plan = await service.plan_turn(ext, session, prompt, ticket, choice.fallback, named)  # 6. the base's KV

        async def spliced(progress: PrefillProgress) -> ChatTurn:
            chat = await service.session_turn(plan, owner, progress)  # 7. splice + prefill
            stack.callback(lambda: setattr(session, "handle", chat.turn.handle))  # the new base, after decoding
            return chat

        return session, spliced

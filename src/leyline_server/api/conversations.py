"""Auto-splice (``--auto-splice``): a plain client's next turn continues its own conversation's session.

A client that sends no ``leyline`` field still has its template's edits spliced when the server
can tell which conversation a request continues. A request continues session ``S`` only when

* ``S`` belongs to the same key and no request is on it,
* ``S``'s last request (its *transcript*: tools and messages) is an exact prefix of this
  request, with at least one message after it: ``S``'s own previous turn, extended.

Everything ``S``'s KV was computed from is then part of this request too. What differs between
``S``'s base and the new prompt is the template's doing (earlier reasoning dropped, dates) and
the reply as the client sent it back; it is explained by
:func:`leyline_sdk.explain.turns.explain_client_turn` and spliced. Anything else — another conversation
sharing a prefix, the client's own edit of an earlier message, a session another request moved
on meanwhile — cannot be told apart from another client's conversation, so it gets a new
session: exact KV, the radix cache reusing only the key's exact prefixes.

:class:`AutoSplicer` is the one owner of this state: ``Session.auto`` holds an
:class:`AutoState` that only this module reads or writes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from leyline_sdk.core.errors import RenderError
from leyline_sdk.explain.templates import Transcript
from leyline_sdk.explain.turns import decoder_of, explain_client_turn
from leyline_sdk.render.incremental import Snapshot
from leyline_sdk.render.rendering import normalize_messages
from leyline_server.api.errors import APIError
from leyline_server.api.render import BoundedChat, RenderService, message_digests
from leyline_server.engines.values import SpliceRequest
from leyline_server.sessions import Session, SessionStore

__all__ = ["AutoSplicer", "AutoState", "AutoTurn", "Prompt"]


@dataclass(frozen=True)
class AutoState:
    """A session's conversation as auto-splice knows it: the request that produced its base."""

    transcript: Transcript
    snapshot: Snapshot | None  # that request's rendering, where the next turn's render starts
    digest: str  # message_digests(...)[-1] of the transcript


@dataclass
class AutoTurn:
    """A plain request under auto-splice: the session it continues (``None``: a new one), its render."""

    tokens: list[int]
    transcript: Transcript
    snapshot: Snapshot | None
    digest: str
    session: Session | None = None
    state: AutoState | None = None  # the session's state when it was matched
    sources: list[str] = field(default_factory=list)  # who made each directive ("template")


class Prompt(NamedTuple):
    """A chat request's prompt tokens and, for a plain client under auto-splice, its conversation."""

    tokens: list[int]
    auto: AutoTurn | None = None


class AutoSplicer:
    """Matches plain requests to their own conversation's session and explains the template's edits."""

    def __init__(self, sessions: SessionStore, render: RenderService) -> None:
        self.sessions, self.render = sessions, render
        self._index: dict[tuple[str | None, str], str] = {}  # (key, transcript digest) -> session id
        sessions.on_drop = self.forget

    async def prepare(self, owner: str | None, messages: Sequence[Any], tools: list[Any] | None) -> AutoTurn | None:
        """Render the request (incrementally from its conversation) and find its session.

        ``None`` when per-message spans cannot be had in time: the request is then served
        plainly, without a session.
        """
        msgs = normalize_messages(messages)
        digests = message_digests(msgs, tools)
        session, state = self._match(owner, digests)
        try:
            rendered, snapshot = await self.render.spans(owner, msgs, tools, True, state.snapshot if state else None)
        except APIError as exc:
            if exc.code != "render_timeout":
                raise
            return None
        turn = AutoTurn(list(rendered.tokens), Transcript(msgs, tools, rendered), snapshot, digests[-1])
        turn.session, turn.state = session, state
        return turn

    def _match(self, owner: str | None, digests: list[str]) -> tuple[Session | None, AutoState | None]:
        """The idle session whose transcript is the longest proper prefix of the request."""
        for n in range(len(digests) - 2, 0, -1):
            sid = self._index.get((owner, digests[n]))
            if sid is None:
                continue
            session = self.sessions.get(sid, owner)
            state = session.auto if session is not None else None
            if session is None or not isinstance(state, AutoState) or state.digest != digests[n]:
                del self._index[(owner, digests[n])]
                continue
            return (session, state) if session.users == 0 else (None, None)
        return None, None

    def continues(self, session: Session, turn: AutoTurn) -> bool:
        """Whether ``session`` (held by the caller) is still as ``turn`` matched it."""
        return turn.state is not None and session is turn.session and session.auto is turn.state

    async def splice_request(self, session: Session, turn: AutoTurn) -> SpliceRequest | None:
        """The template's edits between ``session``'s base and the prompt (``None``: it extends the base)."""
        base, prompt, state = session.tokens, turn.tokens, turn.state
        turn.sources = []
        if state is None or not base or prompt[: len(base)] == base:
            return None

        def job(chat: BoundedChat) -> Any:
            render = functools.partial(_render_tokens, chat)
            return explain_client_turn(base, state.transcript, turn.transcript, render, decoder_of(chat))

        try:
            explained = await self.render.run(session.owner, job)
        except APIError:  # out of time: no splice; the prefill reuses the exact common prefix
            return None
        turn.sources = [s.value for s in explained.sources]
        return SpliceRequest(explained.directives, prompt=prompt)

    def commit(self, session: Session, turn: AutoTurn) -> None:
        """The turn started on ``session``: this request is its transcript now."""
        self.forget(session)
        session.auto = AutoState(turn.transcript, turn.snapshot, turn.digest)
        self._index[(session.owner, turn.digest)] = session.id

    def forget(self, session: Session) -> None:
        """``session`` is no longer a plain client's conversation (spliced by a client, or dropped)."""
        state = session.auto
        if isinstance(state, AutoState) and self._index.get((session.owner, state.digest)) == session.id:
            del self._index[(session.owner, state.digest)]
        session.auto = None


def _render_tokens(chat: BoundedChat, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int] | None:
    """One template render's tokens (``None`` if the template refuses)."""
    try:
        return chat.encode(chat.render_text(messages, tools, True))[0]
    except RenderError:
        return None

"""Plain clients' conversations: which one a request continues, after its client edited it.

A client that sends no ``leyline`` field gets a session per conversation when the server runs
with ``--auto-splice`` or the request opts in to client-edit splicing (``X-Leyline-Client-Edits``,
:mod:`leyline_server.api.client_edits`). Every wire protocol (chat completions, Responses, Messages) comes
here through the one pipeline.

**Identity** (:mod:`leyline_sdk.explain.identity`). A request continues session ``S`` of the
same key, idle (no request on it), found by the first of these that finds any candidate:

1. **its reply** — the request carries ``S``'s *latest* reply, the assistant message the server
   generated for ``S``'s last turn, found by its mark (tool-call ids, else a digest of its text):
   what survives the client's edits (cleared tool results, trimmed messages, a summary) and is
   the server's own;
2. **its prefix** — ``S``'s last request (tools and messages) is an exact prefix of this one, with
   at least one message after it (a client that sends back a reply other than the server's: a
   replayed trace, a re-serialised one);
3. **its name** — the request's ``prompt_cache_key`` (Codex sends its session id; the Messages
   adapter maps Claude Code's session there) is ``S``'s, and the two open alike (the messages
   before the first assistant message);
4. **its neighbour** (only under the opt-in; opens a *new* session) — the prompt differs from the
   exact cached tokens of one of the key's conversations only in short spans followed by long
   identical runs (:mod:`leyline_server.api.reuse`): those tokens are reused, the spans spliced.

Rules 1–3 find ``S`` only when ``S`` is its *only* candidate (among several, those with the
request's ``prompt_cache_key`` count): two conversations that open alike and were answered alike
both match, and the request continues neither: a new session, never a wrong one. A hint never
joins two conversations: a session whose ``prompt_cache_key``, ``user`` or ``safety_identifier``
differs from the request's is never a candidate (the hints are kept as digests). A request that
carries only an older reply of ``S`` (a fork, a retry) matches nothing and gets a new session:
exact KV, the key's prefix cache reusing what it can.

A request that offers no tools where ``S``'s last one did is a side request, not ``S``'s next
turn: Codex's compaction asks for its summary that way, then goes on with the tools and a
rewritten history. It gets a new session, so ``S``'s KV stays as it was for the requests after
it (an engine that splices in place, llama.cpp, would otherwise move ``S`` on to the summary).

When the reply was not proven (rules 2 and 3), nothing of ``S``'s base from its generated reply
on is kept: the request's own reply and everything after it are prefilled (exact).

**Edits.** Between ``S``'s base and the new prompt lie the template's edits (earlier reasoning
dropped, dates) and the client's own (:func:`leyline_sdk.explain.turns.explain_client_turn`): the
template's are spliced as auto-splice always did; the client's are spliced in ``amortize`` mode
only under the opt-in, and otherwise recomputed from the first one (``forget``): the prefix
before the edit is reused, the rest prefilled — exactly what a fresh prefill gives.

**Exactness.** Once a turn that asked for amortize (``X-Leyline-Client-Edits: amortize``, or
``--client-edits amortize``) left approximate KV in a session, that session is continued only by
turns that ask for amortize too. Any other request that continues the conversation — the same
client without the header or with ``exact``, another client through ``previous_response_id`` —
gets a new session: its prefill reuses the key's exact prefix cache up to the first rotated
token and computes the rest, so it is served no approximate KV at all (the spliced path lives
under the old session's private tag, which no other session matches).

:class:`Conversations` is the one owner of this state: ``Session.auto`` holds a
:class:`ConversationState` only this module reads or writes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from leyline_sdk.core.directives import Directive, Mode, truncate_result
from leyline_sdk.core.errors import RenderError
from leyline_sdk.explain.identity import opening, reply_mark
from leyline_sdk.explain.templates import Transcript
from leyline_sdk.explain.turns import decoder_of, explain_client_turn
from leyline_sdk.render.incremental import Snapshot
from leyline_sdk.render.rendering import normalize_messages
from leyline_server.api.errors import APIError
from leyline_server.api.render import BoundedChat, RenderService, message_digests
from leyline_server.api.reuse import Reuse, best_reuse
from leyline_server.contract.values import Handle, SpliceRequest
from leyline_server.sessions import Session, SessionStore

__all__ = [
    "ConversationState",
    "Conversations",
    "Prompt",
    "RecognisedTurn",
    "hints_of",
]

HINTS = ("prompt_cache_key", "user", "safety_identifier")
CONVERSATION_KEY = "prompt_cache_key"
PEOPLE = ("user", "safety_identifier")  # hints naming who, not which conversation
REUSE_CANDIDATES = 32  # rule 4 looks at the key's most recently used conversations only


def hints_of(req: Any) -> dict[str, str]:
    """A request's conversation hints: its ``prompt_cache_key``, ``user`` and ``safety_identifier``,
    each kept as a digest (recognition only compares them; a session never holds the client's
    bytes, however long they are)."""
    out = {}
    for name in HINTS:
        value = getattr(req, name, None)
        if isinstance(value, str) and value:
            out[name] = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return out


def _conflict(mine: Mapping[str, str], theirs: Mapping[str, str]) -> bool:
    """Whether two hint sets name different conversations or users."""
    return any(name in theirs and theirs[name] != value for name, value in mine.items())


@dataclass(frozen=True)
class ConversationState:
    """A session's conversation as the server knows it: the request that produced its base, that
    request's rendering (where the next turn's render starts), its hints, and the mark of the
    reply the server generated for it (``None`` until the turn ended with one)."""

    transcript: Transcript
    snapshot: Snapshot | None
    hints: Mapping[str, str] = field(default_factory=dict)
    digest: str = ""  # message_digests(...)[-1] of the transcript
    reply: str | None = None
    private: bool = False  # its KV holds approximate rows made for a turn that asked for amortize


@dataclass
class RecognisedTurn:
    """A plain request with a conversation: the session it continues (``None``: a new one), its render,
    and the mode of the client's own edits."""

    tokens: list[int]
    transcript: Transcript
    snapshot: Snapshot | None
    hints: Mapping[str, str]
    digest: str
    client_mode: Mode = Mode.FORGET
    session: Session | None = None
    state: ConversationState | None = None  # the session's state when it was matched
    reply_proven: bool = False  # matched by the session's own reply (rule 1)
    splice: bool = True  # False: continued exactly, nothing spliced
    exact: bool = False  # the client asked for exact KV: every edit recomputed, no approximate KV continued
    sources: list[str] = field(default_factory=list)  # who made each directive ("template", "client", ...)
    reuse: Reuse | None = None  # rule 4: open the new session on another conversation's tokens


class Prompt(NamedTuple):
    """A chat request's prompt tokens and, for a plain client with a conversation, that conversation."""

    tokens: list[int]
    auto: RecognisedTurn | None = None


class Conversations:
    """Recognises plain requests' conversations and explains their edits; see the module docstring."""

    def __init__(self, sessions: SessionStore, render: RenderService) -> None:
        self.sessions, self.render = sessions, render
        self._by_reply: dict[tuple[str | None, str], list[str]] = {}  # (key, reply mark) -> session ids
        self._by_prefix: dict[tuple[str | None, str], list[str]] = {}  # (key, transcript digest) -> ids
        sessions.on_drop = self.forget

    async def prepare(
        self,
        owner: str | None,
        messages: Sequence[Any],
        tools: list[Any] | None,
        hints: Mapping[str, str] | None = None,
        client_mode: Mode = Mode.FORGET,
        splice: bool = True,
        exact: bool = False,
    ) -> RecognisedTurn | None:
        """Render the request (incrementally from its conversation) and find its session.

        ``splice=False``: the session is continued exactly (its prefix reused, nothing spliced:
        a conversation protocol without ``--auto-splice`` or the opt-in). ``exact``: the client
        asked for exact KV (``X-Leyline-Client-Edits: exact``): the template's edits are recomputed
        too, and a session holding approximate KV is not continued (a new one reuses its exact prefix).

        ``None`` when per-message spans cannot be had in time: the request is then served
        plainly, without a session.
        """
        msgs, hints = normalize_messages(messages), dict(hints or {})
        digests = message_digests(msgs, tools)
        session, state, proven = self._match(owner, msgs, hints, digests)
        start = state.snapshot if state else None
        approximate = session is not None and _approximate(session.handle)
        not_for_me = state is not None and (state.private and client_mode is not Mode.AMORTIZE or exact and approximate)
        if not_for_me:  # its approximate KV is not for this turn: a new session
            session, state, proven = None, None, False
        if state is not None and state.transcript.tools and not tools:
            session, state, proven = None, None, False  # a side request (a summary, a title): a new session
        try:
            rendered, snapshot = await self.render.spans(owner, msgs, tools, True, start)
        except APIError as exc:
            if exc.code != "render_timeout":
                raise
            return None
        transcript = Transcript(msgs, tools, rendered)
        turn = RecognisedTurn(list(rendered.tokens), transcript, snapshot, hints, digests[-1], client_mode)
        turn.session, turn.state, turn.reply_proven, turn.splice, turn.exact = session, state, proven, splice, exact
        if session is None and splice and client_mode is Mode.AMORTIZE:
            turn.reuse = best_reuse(self._cached_paths(owner, hints), turn.tokens)
        return turn

    def _cached_paths(self, owner: str | None, hints: Mapping[str, str]) -> list[list[int]]:
        """The exact cached tokens of the key's 32 most recently used conversations whose ``user``
        and ``safety_identifier`` are the request's (rule 4's candidates: the moved rows were
        computed next to the other conversation's spans)."""
        handles = [
            s.handle
            for s in self.sessions.owned_by(owner)
            if isinstance(s.auto, ConversationState)
            and s.handle is not None
            and all(s.auto.hints.get(name) == hints.get(name) for name in PEOPLE)
        ]
        return [list(h.tokens[: min(h.exact, h.cached)]) for h in handles[-REUSE_CANDIDATES:] if h is not None]

    def _match(
        self, owner: str | None, msgs: list[dict[str, Any]], hints: Mapping[str, str], digests: list[str]
    ) -> tuple[Session | None, ConversationState | None, bool]:
        """The one idle session the request continues (see the module docstring), else none; and
        whether its reply was proven (rule 1)."""
        for mark in reversed([m for m in (reply_mark(msg) for msg in msgs) if m is not None]):
            found = self._live(owner, self._by_reply.get((owner, mark), ()), hints, mark)
            if found:
                exact = [(s, st) for s, st in found if _extends(msgs, st)]
                return (*_only(_named(exact or found, hints)), True)
        for n in range(len(digests) - 2, 0, -1):
            found = self._live(owner, self._by_prefix.get((owner, digests[n]), ()), hints)
            found = [(s, st) for s, st in found if st.digest == digests[n]]
            if found:
                return (*_only(_named(found, hints)), False)
        name = hints.get(CONVERSATION_KEY)
        if name is None:
            return None, None, False
        first = opening(msgs)
        named = [
            (s, s.auto)
            for s in self.sessions.owned_by(owner)
            if isinstance(s.auto, ConversationState)
            and s.auto.hints.get(CONVERSATION_KEY) == name
            and not _conflict(hints, s.auto.hints)
            and opening(s.auto.transcript.messages) == first
        ]
        return (*_only(named), False)

    def _live(
        self, owner: str | None, ids: Sequence[str], hints: Mapping[str, str], reply: str | None = None
    ) -> list[tuple[Session, ConversationState]]:
        """The sessions ``ids`` that still exist with a conversation (whose latest reply is ``reply``,
        when given) and no conflicting hint."""
        found = []
        for sid in list(ids):
            session = self.sessions.get(sid, owner)
            if session is None:
                continue
            state = session.auto
            if not isinstance(state, ConversationState) or _conflict(hints, state.hints):
                continue
            if reply is None or state.reply == reply:
                found.append((session, state))
        return found

    def continues(self, session: Session, turn: RecognisedTurn) -> bool:
        """Whether ``session`` (held by the caller) is still as ``turn`` matched it."""
        return turn.state is not None and session is turn.session and session.auto is turn.state

    async def edits_request(self, session: Session, turn: RecognisedTurn) -> SpliceRequest | None:
        """The edits between ``session``'s base and the prompt (``None``: it extends the base)."""
        base, prompt, state = session.tokens, turn.tokens, turn.state
        turn.sources = []
        if state is None and turn.reuse is not None:  # rule 4: a new session opened on turn.reuse.base
            if tuple(base) != turn.reuse.base:  # (set only when the turn splices)
                return None
            turn.sources = ["conversation"] * len(turn.reuse.directives)
            return SpliceRequest(list(turn.reuse.directives), prompt=prompt)
        if not turn.splice or state is None or not base or prompt[: len(base)] == base:
            return None

        def job(chat: BoundedChat) -> Any:
            render = functools.partial(_render_tokens, chat)
            decode = decoder_of(chat)
            return explain_client_turn(base, state.transcript, turn.transcript, render, decode, turn.client_mode)

        try:
            explained = await self.render.run(session.owner, job)
        except APIError:  # out of time: no splice; the prefill reuses the exact common prefix
            return None
        directives, sources = explained.directives, [s.value for s in explained.sources]
        if turn.exact:  # the template's edits too: recomputed from the first one
            directives = [d.model_copy(update={"mode": Mode.FORGET, "repair": 0}) for d in directives]
        if not turn.reply_proven:  # keep nothing of the base from its generated reply on
            directives = truncate_result(
                len(base), directives, _before(directives, len(state.transcript.render.tokens))
            )
            sources = sources[: len(directives) - 1] + ["client"] if len(directives) > len(sources) else sources
            sources = sources[: len(directives)]
        turn.sources = sources
        return SpliceRequest(directives, prompt=prompt)

    def commit(self, session: Session, turn: RecognisedTurn, handle: Handle | None = None) -> None:
        """The turn started on ``session`` (its KV now ``handle``): this request is its transcript
        now (its reply comes later). A turn that asked for amortize and holds approximate KV makes
        the session private to such turns (see the module docstring)."""
        private = isinstance(session.auto, ConversationState) and session.auto.private
        if turn.client_mode is Mode.AMORTIZE and _approximate(handle):
            private = True
        self.forget(session)
        session.auto = ConversationState(turn.transcript, turn.snapshot, turn.hints, turn.digest, private=private)
        _add(self._by_prefix, (session.owner, turn.digest), session.id)

    def replied(self, session: Session, message: Mapping[str, Any]) -> None:
        """The turn on ``session`` ended with ``message``: the next request is recognised by it."""
        state, mark = session.auto, reply_mark(message)
        if not isinstance(state, ConversationState) or mark is None:
            return
        session.auto = dataclasses.replace(state, reply=mark)
        _add(self._by_reply, (session.owner, mark), session.id)

    def forget(self, session: Session) -> None:
        """``session`` is no longer a plain client's conversation (spliced by a client, or dropped)."""
        state = session.auto
        if isinstance(state, ConversationState):
            _remove(self._by_prefix, (session.owner, state.digest), session.id)
            if state.reply is not None:
                _remove(self._by_reply, (session.owner, state.reply), session.id)
        session.auto = None


def _approximate(handle: Handle | None) -> bool:
    """Whether ``handle``'s KV holds approximate rows (a splice's, in ``amortize`` mode)."""
    return handle is not None and handle.exact < handle.cached


def _add(index: dict[tuple[str | None, str], list[str]], key: tuple[str | None, str], sid: str) -> None:
    ids = index.setdefault(key, [])
    if sid not in ids:
        ids.append(sid)


def _remove(index: dict[tuple[str | None, str], list[str]], key: tuple[str | None, str], sid: str) -> None:
    ids = index.get(key)
    if ids is not None and sid in ids:
        ids.remove(sid)
        if not ids:
            del index[key]


def _before(directives: Sequence[Directive], at: int) -> int:
    """How many result tokens ``apply(base, directives)`` builds before base token ``at`` is copied
    (a directive that spans ``at`` counts with its replacement)."""
    pos = cursor = 0
    for d in directives:
        if d.start >= at:
            break
        pos += d.start - cursor + len(d.replacement)
        cursor = d.end
        if cursor >= at:
            return pos
    return pos + max(at - cursor, 0)


def _named(
    found: list[tuple[Session, ConversationState]], hints: Mapping[str, str]
) -> list[tuple[Session, ConversationState]]:
    """Among several candidates, those named like the request (its ``prompt_cache_key``), if any."""
    name = hints.get(CONVERSATION_KEY)
    if len(found) < 2 or name is None:
        return found
    return [(s, st) for s, st in found if st.hints.get(CONVERSATION_KEY) == name] or found


def _only(
    found: Sequence[tuple[Session, ConversationState]],
) -> tuple[Session | None, ConversationState | None]:
    """The one candidate, if idle; none when several are equally likely or it is in use."""
    if len(found) != 1 or found[0][0].users:
        return None, None  # equally likely, or in use by a request of its own: a new session
    return found[0]


def _extends(msgs: Sequence[Mapping[str, Any]], state: ConversationState) -> bool:
    """Whether ``msgs`` is the state's transcript unchanged, then its reply, then more."""
    k = len(state.transcript.messages)
    return len(msgs) > k + 1 and list(msgs[:k]) == state.transcript.messages and reply_mark(msgs[k]) == state.reply


def _render_tokens(chat: BoundedChat, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int] | None:
    """One template render's tokens (``None`` if the template refuses)."""
    try:
        return chat.encode(chat.render_text(messages, tools, True))[0]
    except RenderError:
        return None

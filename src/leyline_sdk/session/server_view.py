"""What a session's client believes the server holds: :class:`ServerView`.

The server keeps one session per conversation: an id, and a *base* (every token of the
conversation so far: the last prompt plus what was generated). Directives name spans of that
base, so the client must know it exactly; it also remembers which effective messages the base's
prompt part was rendered from (``seen``, ``seen_render``: what the next turn diffs against).

Everything here is bookkeeping, no I/O: the session's requests (:mod:`leyline_sdk.session.ops`)
read and update this object through its methods, never the session's attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.directives import Directive, Mode, apply, digest
from leyline_sdk.core.wire import BaseRef
from leyline_sdk.render.rendering import RenderedConversation

__all__ = ["ServerView"]


@dataclass
class ServerView:
    """The server-side session as the client knows it.

    * ``session_id``: the server's session (``None``: the next request opens one);
    * ``base_tokens`` / ``base_digest``: the base (``None``: unknown, so no directives are sent);
    * ``seen`` / ``seen_render``: the effective messages the base's prompt was rendered from, and
      that rendering;
    * ``pending_modes``: modes of edits ``sync_edits`` could not send (an unstable template),
      left to the next request, by effective message index;
    * ``unrecorded``: a turn sent with the extension whose answer was not read yet (the next
      turn asks the server where its base went);
    * ``abandoned``: server sessions a strict refusal left behind, deleted at the next turn;
    * ``replies``: identity marks of the replies the server generated in this session
      (:mod:`leyline_sdk.explain.identity`), most recent last.
    """

    session_id: str | None = None
    base_tokens: list[int] | None = None
    base_digest: str | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)
    seen_render: RenderedConversation | None = None
    pending_modes: dict[int, Mode] = field(default_factory=dict)
    unrecorded: Any = None
    abandoned: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)

    @property
    def knows_base(self) -> bool:
        """Whether directives can be computed against the base (it is known, with its rendering)."""
        return self.base_tokens is not None and self.seen_render is not None

    def base_ref(self) -> BaseRef:
        """The base as the extension names it (length and digest)."""
        assert self.base_tokens is not None
        return BaseRef(length=len(self.base_tokens), digest=self.base_digest)

    def adopt(
        self, base: list[int], base_digest: str, seen: list[dict[str, Any]], render: RenderedConversation
    ) -> None:
        """The server holds ``base`` (its digest checked), rendered from ``seen`` as ``render``."""
        self.base_tokens, self.base_digest, self.seen, self.seen_render = base, base_digest, seen, render

    def forget_base(self) -> None:
        """The base is unknown from now on (the next request sends no directives)."""
        self.base_tokens, self.base_digest, self.seen, self.seen_render = None, None, [], None

    def lose_session(self) -> None:
        """The server no longer has the session: the next request opens a new one."""
        self.session_id = None
        self.replies = []
        self.forget_base()

    def abandon_session(self) -> None:
        """A strict refusal: delete this server session at the next turn, and open a new one."""
        if self.session_id is not None:
            self.abandoned.append(self.session_id)
        self.lose_session()

    def spliced(
        self,
        directives: Sequence[Directive],
        server_digest: str,
        seen: list[dict[str, Any]],
        render: RenderedConversation,
    ) -> None:
        """The server applied ``directives`` without generating and answered with ``server_digest``.

        The base becomes ``apply(base, D)``, rendered from the edited messages ``seen`` as
        ``render``, when the digests agree; an answer that is neither the new nor the old base
        leaves it unknown.
        """
        assert self.base_tokens is not None
        new_base = apply(self.base_tokens, directives)
        new_digest = digest(new_base)
        if server_digest == new_digest:
            self.adopt(new_base, new_digest, seen, render)
        elif server_digest != self.base_digest:
            self.forget_base()

    def moved_to(self, tokens: list[int], server_digest: str, sent_prompt: Sequence[int]) -> bool | None:
        """After an unread turn: ``True`` when the server's base is the sent prompt plus generated
        tokens, ``False`` when it is something else, ``None`` when it did not move (or is not
        self-consistent)."""
        if server_digest != digest(tokens) or tokens == self.base_tokens:
            return None
        return tokens[: len(sent_prompt)] == list(sent_prompt)

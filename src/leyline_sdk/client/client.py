"""``AsyncLeyline`` is an ``openai.AsyncOpenAI`` (and ``Leyline`` an ``openai.OpenAI``) with sessions.

::

    async with AsyncLeyline(base_url="http://localhost:8000/v1", policies=[TruncateOlderThanN(2)]) as client:
        response = await client.chat.completions.create(model="m", messages=messages, tools=tools)
        response.leyline            # session id, reused / rotated / prefilled tokens, fallback

Everything but ``chat.completions.create`` / ``parse`` is openai-python's own: the constructor's
arguments and environment variables (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ...),
``with_options`` / ``copy``, ``models``, ``with_raw_response``, ``with_streaming_response``,
``omit`` / ``NOT_GIVEN``, ``extra_headers`` / ``extra_body`` / ``extra_query`` / ``timeout``,
``AsyncStream``, the exceptions, ``_request_id``. Leyline's own routes go through the same
client (:mod:`leyline_sdk.client.routes`). Differences from openai's defaults, on purpose:

* ``base_url`` defaults to ``$OPENAI_BASE_URL``, else ``http://127.0.0.1:8000/v1`` (a local
  server), not OpenAI's API;
* no API key is required: without ``api_key`` and ``$OPENAI_API_KEY`` no ``Authorization``
  header is sent (a server started without ``--api-key``);
* ``max_retries`` defaults to 6 (openai: 2). openai's backoff (0.5 s doubling to at most 8 s,
  minus up to 25 % jitter) then waits at least 17.6 s in total over 6 retries (0.5 + 1 + 2 + 4 +
  8 + 8 = 23.5 s nominal) before giving up, so a server restart of ~10 s is ridden over without
  an error (connection errors, 408, 409, 429 and 5xx are retried, as openai does).

Leyline's arguments: ``policies``, ``tokenizer`` (a local
:class:`~leyline_sdk.render.rendering.ChatTokenizer` rendering like the server; default: the
server's ``/leyline/tokenize``), ``strict`` (raise
:class:`~leyline_sdk.client.fallback.SpliceFallbackError` instead of falling back),
``max_sessions`` (sessions remembered, least recently used first out; a forgotten one's
server-side session is deleted at the next call), ``client_edits`` (how the agent's own edits of
its history are spliced: ``"auto"``, the default, splices content it removed or shortened — a
cleared tool result, a placeholder, a summary — and recomputes content it changed otherwise;
``"amortize"`` / ``"forget"`` for every edit; :mod:`leyline_sdk.session.planner`),
``seam_repair`` (tokens recomputed after each ``amortize`` replacement), ``behind_router`` and
``routing_header`` (a gateway such as SGLang's router in front: each session sends its own
routing key in that header, default ``X-SMG-Routing-Key``, and the extension in
``metadata["leyline"]``, over ``/v1/chat/completions`` only; give a local ``tokenizer`` to
splice there. SGLang's router is also detected from the first 404 on a Leyline route, and logged
once: :mod:`leyline_sdk.session.gateway`). ``with_options`` keeps them (and can change
``policies``, ``tokenizer``, ``strict``, ``seam_repair``); a copy for the same base URL and key
shares the parent's sessions (:mod:`leyline_sdk.client.registry`). Sessions are explicit
(``client.session(...)``) or found by conversation, even after the agent edited it
(:mod:`leyline_sdk.client.registry`);
``chat.completions.create`` / ``parse`` / ``stream`` and any other ``POST /chat/completions``
made through the client (LiteLLM posts its own request bodies with ``client.post``) go through
them. ``close()`` (``async with`` exit) deletes the server-side sessions of every remembered
session, then closes the HTTP client. Against a server without Leyline (no
``/v1/leyline/tokenize``) the client is a plain openai client: policies still shorten the
context, and no ``leyline`` field is sent.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import openai

from leyline_sdk.client.completions import AsyncLeylineChat, LeylineChat
from leyline_sdk.client.options import LeylineOptions, connection
from leyline_sdk.client.post import route_post, route_post_sync
from leyline_sdk.client.registry import ClientState
from leyline_sdk.client.routes import AsyncRoutes, SyncRoutes, drive
from leyline_sdk.client.sync import SyncBlocks, SyncSession
from leyline_sdk.session.blocks import Blocks
from leyline_sdk.session.gateway import DEFAULT_ROUTING_HEADER, Gateway
from leyline_sdk.session.port import LeylineRoutes
from leyline_sdk.session.renderer import LocalRenderer, Renderer, ServerRenderer
from leyline_sdk.session.session import LeylineSession

__all__ = ["AsyncLeyline", "Leyline", "DEFAULT_BASE_URL", "DEFAULT_MAX_RETRIES"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MAX_RETRIES = 6

_NOT_GIVEN: Any = openai.NOT_GIVEN


class _LeylineParts:
    """What both clients add to openai's: options, shared state, sessions (a mixin)."""

    _leyline: LeylineOptions
    _leyline_state: ClientState
    _routes: LeylineRoutes

    def _setup(self, options: LeylineOptions, state: ClientState | None, routes: LeylineRoutes) -> None:
        client: Any = self
        self._leyline, self._routes = options, routes
        key = (str(client.base_url), str(client.api_key))
        self._leyline_state = ClientState.share(
            state, routes, key, options.max_sessions, options.behind_router, options.routing_header
        )

    @property
    def policies(self) -> list[Any]:
        """The policies of new sessions."""
        return list(self._leyline.policies)

    @property
    def tokenizer(self) -> Any:
        """The local tokenizer of new sessions (``None``: the server's ``/leyline/tokenize``)."""
        return self._leyline.tokenizer

    @property
    def strict(self) -> bool:
        """Whether new sessions raise instead of falling back."""
        return self._leyline.strict

    @property
    def seam_repair(self) -> int:
        """Tokens recomputed after each ``amortize`` replacement (new sessions)."""
        return self._leyline.seam_repair

    @property
    def client_edits(self) -> str:
        """How new sessions splice the agent's own edits of its history (``auto``, ``amortize``, ``forget``)."""
        return self._leyline.client_edits

    @property
    def gateway(self) -> Gateway | None:
        """The gateway requests pass (``behind_router=True`` or a detected router), else ``None``."""
        return self._leyline_state.probe.gateway

    @property
    def max_sessions(self) -> int:
        """How many sessions the (shared) registry remembers."""
        return self._leyline_state.registry.max_sessions

    def renderer(self) -> Renderer:
        """A renderer for one new session: the local tokenizer if given, else the server's."""
        if self._leyline.tokenizer is not None:
            return LocalRenderer(self._leyline.tokenizer, self._leyline_state.probe)
        return ServerRenderer(self._routes, self._leyline_state.probe)

    def _core_session(
        self,
        policies: Sequence[Any] | None,
        strict: bool | None,
        tools: Sequence[Mapping[str, Any]] | None,
        seam_repair: int | None,
        send: Any,
    ) -> LeylineSession:
        state, options = self._leyline_state, self._leyline
        session = LeylineSession(
            self._routes,
            self.renderer(),
            options.policies if policies is None else policies,
            options.strict if strict is None else strict,
            tools,
            on_use=state.registry.touch,
            seam_repair=options.seam_repair if seam_repair is None else seam_repair,
            client_edits=options.client_edits,  # type: ignore[arg-type]  # checked by LeylineOptions
            blocks=state.blocks,
            send=send,
        )
        state.registry.touch(session)
        return session

    def _copy_kwargs(self, overrides: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
        """The Leyline arguments of a copy: this client's, updated by the given ``overrides``."""
        options = self._leyline.replace(**{k: v for k, v in overrides.items() if v is not _NOT_GIVEN})
        return {**options.as_kwargs(), "_leyline_state": self._leyline_state, **extra}

    def _validate_headers(self, headers: Any, custom_headers: Any) -> None:
        """openai's check, except that a client without an API key may send no ``Authorization``."""
        client: Any = self
        if not client.api_key:
            return
        super()._validate_headers(headers, custom_headers)  # type: ignore[misc]


def _no_key_needed() -> dict[str, Any]:
    """openai's switch for a client without an API key, where this openai version has one."""
    accepted = inspect.signature(openai.AsyncOpenAI.__init__).parameters
    return {"_enforce_credentials": False} if "_enforce_credentials" in accepted else {}


class AsyncLeyline(_LeylineParts, openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` with Leyline sessions; see the module docstring.

    ``client.blocks`` creates, reuses and deletes precompiled KV blocks (``leyline_sdk.session.blocks``);
    ``client.sessions`` lists the remembered sessions, least recently used first.
    """

    def __init__(
        self,
        *,
        policies: Sequence[Any] = (),
        tokenizer: Any = None,
        strict: bool = False,
        max_sessions: int = 256,
        seam_repair: int = 4,
        behind_router: bool = False,
        routing_header: str = DEFAULT_ROUTING_HEADER,
        client_edits: str = "auto",
        base_url: Any = None,
        api_key: Any = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        _leyline_state: ClientState | None = None,
        **kwargs: Any,
    ) -> None:
        options = LeylineOptions.of(
            policies, tokenizer, strict, max_sessions, seam_repair, behind_router, routing_header, client_edits
        )
        kwargs.pop("_enforce_credentials", None)
        base_url, api_key = connection(base_url, api_key, DEFAULT_BASE_URL)
        super().__init__(base_url=base_url, api_key=api_key, max_retries=max_retries, **_no_key_needed(), **kwargs)
        self._setup(options, _leyline_state, AsyncRoutes(self))

    if not TYPE_CHECKING:  # type checkers see openai's overloads

        async def post(self, path, **kwargs):
            """openai's ``post``; a ``POST /chat/completions`` goes through a session (``route_post``)."""
            return await route_post(self, super().post, path, kwargs)

    @cached_property
    def chat(self) -> AsyncLeylineChat:  # type: ignore[override]
        """openai's ``chat`` resource, with Leyline's ``completions``."""
        return AsyncLeylineChat(self, self)

    @property
    def blocks(self) -> Blocks:
        """The client's KV blocks (shared with its copies)."""
        return self._leyline_state.blocks

    @property
    def sessions(self) -> list[LeylineSession]:
        """The sessions remembered (shared with copies), least recently used first."""
        return self._leyline_state.registry.sessions

    def _new_session(self) -> LeylineSession:
        return self.session()

    def session(
        self,
        policies: Sequence[Any] | None = None,
        strict: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        seam_repair: int | None = None,
    ) -> LeylineSession:
        """A new explicit session (defaults: the client's policies, strictness and seam repair)."""
        return self._core_session(policies, strict, tools, seam_repair, self.chat.completions.create_in)

    def copy(  # type: ignore[override]
        self,
        *,
        policies: Any = _NOT_GIVEN,
        tokenizer: Any = _NOT_GIVEN,
        strict: Any = _NOT_GIVEN,
        seam_repair: Any = _NOT_GIVEN,
        client_edits: Any = _NOT_GIVEN,
        _extra_kwargs: Mapping[str, Any] = {},
        **kwargs: Any,
    ) -> AsyncLeyline:
        """openai's ``copy`` / ``with_options``; Leyline's arguments carry over unless given."""
        overrides = {
            "policies": policies,
            "tokenizer": tokenizer,
            "strict": strict,
            "seam_repair": seam_repair,
            "client_edits": client_edits,
        }
        extra = self._copy_kwargs(overrides, _extra_kwargs)
        return super().copy(_extra_kwargs=extra, **kwargs)

    with_options = copy  # type: ignore[assignment]

    async def close(self) -> None:
        """Delete every remembered session on the server (errors ignored), then close HTTP.

        The sessions stay in ``sessions`` (their stats and histories remain readable).
        """
        await self._leyline_state.registry.close()
        await super().close()

    aclose = close


class Leyline(_LeylineParts, openai.OpenAI):
    """``openai.OpenAI`` with Leyline sessions: the blocking twin of :class:`AsyncLeyline`.

    The session core is the same coroutine code, run without an event loop
    (:func:`~leyline_sdk.client.routes.drive`) over the blocking client's requests. ``session()``
    returns a :class:`~leyline_sdk.client.sync.SyncSession`; ``blocks`` is a
    :class:`~leyline_sdk.client.sync.SyncBlocks`.
    """

    def __init__(
        self,
        *,
        policies: Sequence[Any] = (),
        tokenizer: Any = None,
        strict: bool = False,
        max_sessions: int = 256,
        seam_repair: int = 4,
        behind_router: bool = False,
        routing_header: str = DEFAULT_ROUTING_HEADER,
        client_edits: str = "auto",
        base_url: Any = None,
        api_key: Any = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        _leyline_state: ClientState | None = None,
        **kwargs: Any,
    ) -> None:
        options = LeylineOptions.of(
            policies, tokenizer, strict, max_sessions, seam_repair, behind_router, routing_header, client_edits
        )
        kwargs.pop("_enforce_credentials", None)
        base_url, api_key = connection(base_url, api_key, DEFAULT_BASE_URL)
        super().__init__(base_url=base_url, api_key=api_key, max_retries=max_retries, **_no_key_needed(), **kwargs)
        self._setup(options, _leyline_state, SyncRoutes(self))

    if not TYPE_CHECKING:

        def post(self, path, **kwargs):
            """openai's ``post``; a ``POST /chat/completions`` goes through a session (``route_post``)."""
            return route_post_sync(self, super().post, path, kwargs)

    @cached_property
    def chat(self) -> LeylineChat:  # type: ignore[override]
        """openai's ``chat`` resource, with Leyline's ``completions``."""
        return LeylineChat(self, self)

    @property
    def blocks(self) -> SyncBlocks:
        """The client's KV blocks (shared with its copies), blocking."""
        return SyncBlocks(self._leyline_state.blocks)

    @property
    def sessions(self) -> list[SyncSession]:
        """The sessions remembered (shared with copies), least recently used first."""
        return [SyncSession(s, self.chat.completions.create_in) for s in self._leyline_state.registry.sessions]

    def _new_session(self) -> LeylineSession:
        return self._core_session(None, None, None, None, None)

    def session(
        self,
        policies: Sequence[Any] | None = None,
        strict: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        seam_repair: int | None = None,
    ) -> SyncSession:
        """A new explicit session (defaults: the client's policies, strictness and seam repair)."""
        core = self._core_session(policies, strict, tools, seam_repair, None)
        return SyncSession(core, self.chat.completions.create_in)

    def copy(  # type: ignore[override]
        self,
        *,
        policies: Any = _NOT_GIVEN,
        tokenizer: Any = _NOT_GIVEN,
        strict: Any = _NOT_GIVEN,
        seam_repair: Any = _NOT_GIVEN,
        client_edits: Any = _NOT_GIVEN,
        _extra_kwargs: Mapping[str, Any] = {},
        **kwargs: Any,
    ) -> Leyline:
        """openai's ``copy`` / ``with_options``; Leyline's arguments carry over unless given."""
        overrides = {
            "policies": policies,
            "tokenizer": tokenizer,
            "strict": strict,
            "seam_repair": seam_repair,
            "client_edits": client_edits,
        }
        extra = self._copy_kwargs(overrides, _extra_kwargs)
        return super().copy(_extra_kwargs=extra, **kwargs)

    with_options = copy  # type: ignore[assignment]

    def close(self) -> None:
        """Delete every remembered session on the server (errors ignored), then close HTTP."""
        drive(self._leyline_state.registry.close())
        super().close()

"""One ``chat.completions`` call through a Leyline session: openai's arguments in, openai's answer out.

:func:`prepare_call` takes the keyword arguments of ``create`` (or ``parse``) exactly as openai
takes them, finds or makes the session, lets it run its policies and directives, and returns the
arguments to hand to openai's own method: ``messages`` replaced by the effective messages and the
``leyline`` extension merged into ``extra_body`` (nothing is added against a server without
Leyline). Everything else — ``omit``, ``extra_headers``, ``extra_query``, ``timeout``, ``stream``
— passes through untouched. A call whose ``extra_body`` already has a ``leyline`` field manages
the extension itself: it is sent as given, outside any session.

The effective messages travel in ``extra_body`` too (``messages=[]`` to openai's method, whose
body merge puts them back in place, so the request's JSON is the one openai would send):
openai's argument transform walks every message against its ``TypedDict``s (~80 ms at 500
messages), and for chat messages it is the identity on plain JSON values — the message types
carry no aliases or formats. :func:`wire_messages` gives each message exactly what the transform
gives it: itself when it is plain JSON, otherwise what openai's transform makes of it (a pydantic
object or ``omit`` inside), computed here without openai's private modules; the session keeps
(and matches, renders and edits) the messages in that form.
``tests/sdk/test_wire_messages.py`` holds this against openai's own transform and request body.

Both entry points — ``create``'s keyword arguments (:func:`prepare_call`) and a raw
``client.post`` body (:func:`prepare_post`, LiteLLM's way) — add the same things
(:func:`session_extras`: the extension, or its carrier behind a gateway, and the routing header),
each into its own containers. The answer is read in :mod:`leyline_sdk.client.answers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, cast

import openai
import pydantic

from leyline_sdk.client.answers import Call
from leyline_sdk.client.registry import ClientState
from leyline_sdk.core.validation import check_messages, check_model, check_tools
from leyline_sdk.session.gateway import with_carrier
from leyline_sdk.session.session import LeylineSession
from leyline_sdk.session.turn import PreparedTurn

__all__ = [
    "SessionSource",
    "prepare_call",
    "prepare_post",
    "prepare_turn",
    "given",
    "session_extras",
    "with_post_parser",
    "wire_messages",
]

_SCALARS = (str, int, float, bool, type(None))


class SessionSource(Protocol):
    """What a call needs from its client: the shared state and a way to make a session."""

    _leyline_state: ClientState

    def _new_session(self) -> LeylineSession:
        """A new session with the client's defaults."""
        ...


def given(value: Any) -> bool:
    """Whether an argument was given (openai's ``omit`` / ``NOT_GIVEN`` and ``None`` are not)."""
    return value is not None and not isinstance(value, openai.Omit | openai.NotGiven)


def with_post_parser(options: Mapping[str, Any], parser: Callable[[Any], Any]) -> dict[str, Any]:
    """Request ``options`` with ``parser`` run after any post-parser they already have."""
    out = dict(options)
    inner = out.get("post_parser")
    if callable(inner):
        out["post_parser"] = lambda parsed: parser(inner(parsed))
    else:
        out["post_parser"] = parser
    return out


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain JSON (dicts with string keys, lists, scalars) all the way down."""
    if isinstance(value, _SCALARS):
        return True
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) is list:
        return all(_plain(v) for v in value)
    return False


def _wire(value: Any) -> Any:
    """What openai's transform makes of a chat message's value: omitted keys dropped, a pydantic
    object dumped as openai dumps it (set fields, JSON mode), any other iterable a list."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Mapping):
        return {k: _wire(v) for k, v in value.items() if given(v) or v is None}
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(exclude_unset=True, mode="json", exclude=getattr(value, "__api_exclude__", None))
    if isinstance(value, Iterable) and not isinstance(value, bytes | bytearray):
        return [_wire(v) for v in value]
    return value


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as openai's argument transform sends them (see the module docstring)."""
    return [m if _plain(m) else cast(dict[str, Any], _wire(m)) for m in messages]


async def prepare_call(
    client: SessionSource, kwargs: Mapping[str, Any], session: LeylineSession | None = None
) -> Call | None:
    """The session's version of ``create``'s ``kwargs``; ``None`` when the caller sent its own ``leyline``.

    ``session``: an explicit session (``messages`` / ``tools`` left out mean its history / tools);
    otherwise the remembered session whose history the messages extend, or a new one.
    """
    extra_body = kwargs.get("extra_body")
    if isinstance(extra_body, Mapping) and "leyline" in extra_body:
        return None
    if "model" in kwargs:
        check_model(kwargs["model"])
    messages = kwargs.get("messages")
    if session is not None and messages is None:
        messages = session.history
    out = dict(kwargs)
    tools = check_tools(kwargs["tools"]) if given(kwargs.get("tools")) else None
    if session is not None and tools is None and session.tools:
        tools = session.tools
        out["tools"] = tools
    elif session is not None and "tools" in out and out["tools"] is None:
        del out["tools"]  # a session's "no tools given", not a null to send
    session, turn = await prepare_turn(client, messages, tools, session, _cache_key(kwargs.get("prompt_cache_key")))
    out["messages"] = []  # the effective messages go in extra_body: see the module docstring
    mine = (extra_body or {}).get("metadata", out.get("metadata"))
    fields, headers = session_extras(session, turn, mine if given(mine) else None)
    out["extra_body"] = {**(extra_body or {}), "messages": turn.effective, **fields}
    if headers:
        out["extra_headers"] = {**(out.get("extra_headers") or {}), **headers}
    return Call(session, turn, out)


async def prepare_post(
    client: SessionSource, body: Mapping[str, Any], options: Mapping[str, Any]
) -> tuple[Call, dict[str, Any], dict[str, Any]] | None:
    """A ``client.post("/chat/completions", body=..., options=...)`` made outside ``create`` (LiteLLM
    posts its own bodies): the call, its body with the effective messages, and its options with the
    ``leyline`` extension in ``extra_json``. ``None`` when the request carries its own extension."""
    extra = options.get("extra_json")
    if "leyline" in body or (isinstance(extra, Mapping) and "leyline" in extra):
        return None
    tools = check_tools(body["tools"]) if given(body.get("tools")) else None
    cache_key = _cache_key(body.get("prompt_cache_key"))
    session, turn = await prepare_turn(client, body.get("messages"), tools, None, cache_key)
    fields, headers = session_extras(session, turn, body.get("metadata"))
    new_options, new_body = dict(options), {**body, "messages": turn.effective}
    if "metadata" in fields:
        new_body["metadata"] = fields.pop("metadata")
    if fields:
        new_options["extra_json"] = {**(extra or {}), **fields}
    if headers:
        new_options["headers"] = {**(options.get("headers") or {}), **headers}
    return Call(session, turn, {}), new_body, new_options


def session_extras(
    session: LeylineSession, turn: PreparedTurn, metadata: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """What a session's request adds: body fields and headers.

    The ``leyline`` extension as its own field, or — behind a gateway, which drops unknown
    fields but keeps OpenAI's ``metadata`` — inside the caller's ``metadata`` (:func:`with_carrier`);
    behind a gateway also the session's routing header.
    """
    fields: dict[str, Any] = {}
    gateway = session.gateway
    if turn.extension is not None:
        extension = turn.extension.model_dump(mode="json", exclude_none=True)
        if gateway is None:
            fields["leyline"] = extension
        else:
            fields["metadata"] = with_carrier(metadata, extension)
    headers = {gateway.routing_header: session.routing_key} if gateway is not None else {}
    return fields, headers


def _cache_key(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


async def prepare_turn(
    client: SessionSource,
    messages: Any,
    tools: list[dict[str, Any]] | None,
    session: LeylineSession | None,
    cache_key: str | None = None,
) -> tuple[LeylineSession, PreparedTurn]:
    """The session for ``messages`` (``session``, the remembered one they continue, or a new one)
    and its prepared turn: policies run, directives computed."""
    history = wire_messages(check_messages(messages))  # as openai would send them: JSON all the way down
    state = client._leyline_state
    await state.registry.reap()
    if session is None:
        session = state.registry.find(history, cache_key) or client._new_session()
    if cache_key is not None:
        session.cache_key = cache_key
    return session, await session.prepare(history, tools)

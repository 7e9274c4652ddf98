"""One ``responses.create`` / ``responses.stream`` call through a Leyline session.

openai's Responses methods build the request body and call the client's ``post("/responses")``;
:mod:`leyline_sdk.client.post` hands that body here. The request's ``instructions`` and ``input``
items become the chat messages they stand for (:func:`~leyline_sdk.core.responses_items.to_messages`,
the server's own conversion), the session runs its policies and directives on those messages
exactly as for ``chat.completions``, and the effective messages go back as input items
(:func:`~leyline_sdk.core.responses_items.to_items`) with the ``leyline`` extension. So the items
are what the policies edit, and their edits become directives.

A request that continues a stored response (``previous_response_id``), refers to stored items
(``item_reference``), or carries its own ``leyline`` field is sent as given: the server holds
that conversation, not the client. The answer is read by :class:`ResponsesCall` — a ``Response``,
or the ``response.completed`` / ``response.incomplete`` event of a stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import openai
from openai.types.responses import Response

from leyline_sdk.client.answers import Call
from leyline_sdk.client.calls import SessionSource, given, prepare_turn, session_extras
from leyline_sdk.core.responses_items import ItemError, chat_tools, to_items, to_messages
from leyline_sdk.session.record import record_turn

__all__ = ["RESPONSES_PATH", "ResponsesCall", "prepare_responses_post"]

RESPONSES_PATH = "/responses"
_FINAL = ("response.completed", "response.incomplete")


def _reply(response: Any) -> dict[str, Any] | None:
    """The assistant message a response's output items stand for (what identifies it later)."""
    items = [item.model_dump(exclude_none=True) for item in response.output or ()]
    try:
        messages = to_messages(None, [], [i for i in items if i.get("type") in ("message", "function_call")])
    except ItemError:
        return None
    return next((m for m in messages if m.get("role") == "assistant"), None)


class ResponsesCall(Call):
    """A prepared Responses call: records the turn from a ``Response`` or a stream's final event."""

    def post_parser(self, parsed: Any) -> Any:
        """Record the turn from what openai parsed; return it unchanged (a stream: once it ends)."""
        if isinstance(parsed, Response):
            self._finish(parsed)
        elif isinstance(parsed, openai.AsyncStream):
            parsed._iterator = self._aevents(parsed._iterator)
        elif isinstance(parsed, openai.Stream):
            parsed._iterator = self._events(parsed._iterator)
        return parsed

    def _finish(self, response: Any) -> None:
        leyline = getattr(response, "leyline", None) if response is not None else None
        usage = getattr(response, "usage", None) if response is not None else None
        reply = _reply(response) if response is not None else None
        record_turn(self.session, self.turn, leyline, usage, response, reply)

    async def _aevents(self, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
        final = None
        async for event in events:
            final = event.response if getattr(event, "type", None) in _FINAL else final
            yield event
        self._finish(final)

    def _events(self, events: Iterator[Any]) -> Iterator[Any]:
        final = None
        for event in events:
            final = event.response if getattr(event, "type", None) in _FINAL else final
            yield event
        self._finish(final)


def _served_as_given(body: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
    extra = options.get("extra_json")
    own = "leyline" in body or (isinstance(extra, Mapping) and "leyline" in extra)
    items = body.get("input")
    referenced = isinstance(items, list) and any(
        isinstance(i, Mapping) and i.get("type") == "item_reference" for i in items
    )
    return own or given(body.get("previous_response_id")) or referenced or not given(items)


def _as_body(body: Mapping[str, Any], effective: list[dict[str, Any]]) -> dict[str, Any]:
    """``body`` carrying the ``effective`` messages as items (``instructions`` kept when unchanged)."""
    out = dict(body)
    instructions = body.get("instructions")
    first = effective[0] if effective else {}
    if given(instructions) and first == {"role": "system", "content": instructions}:
        out["input"] = to_items(effective[1:])
    else:
        out.pop("instructions", None)
        out["input"] = to_items(effective)
    return out


async def prepare_responses_post(
    client: SessionSource, body: Mapping[str, Any], options: Mapping[str, Any]
) -> tuple[ResponsesCall, dict[str, Any], dict[str, Any]] | None:
    """A ``post("/responses", body=..., options=...)`` through a session: the call, the body with
    the effective items and the extension, and the options. ``None``: send it as given (see the
    module docstring; items this SDK cannot read are the server's to refuse)."""
    if _served_as_given(body, options):
        return None
    try:
        messages = to_messages(body.get("instructions") or None, [], body["input"])
        tools, _ = chat_tools(body.get("tools") if given(body.get("tools")) else None)
    except ItemError:
        return None
    cache_key = body.get("prompt_cache_key")
    cache_key = cache_key if isinstance(cache_key, str) and cache_key else None
    session, turn = await prepare_turn(client, messages, tools or None, None, cache_key)
    metadata = body.get("metadata")
    fields, headers = session_extras(session, turn, metadata if isinstance(metadata, Mapping) else None)
    new_body = {**_as_body(body, list(turn.effective)), **fields}
    new_options = dict(options)
    if headers:
        new_options["headers"] = {**(options.get("headers") or {}), **headers}
    return ResponsesCall(session, turn, {}), new_body, new_options

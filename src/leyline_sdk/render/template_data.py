"""What a chat template sees, prepared once per message while a conversation is rendered many times.

Locating messages renders a conversation once per message prefix (see
:class:`~leyline_sdk.render.rendering.HFChatTokenizer`); transformers' renderer rebuilds the template's
input from scratch on every call (``_plain_template_data``, then ``_alias_reasoning_fields``, both
message by message), which is a third of a render at 500 messages. :class:`TemplateData` does
exactly the same preparation, but once per message dict, and then calls the same compiled
template the same way (``compiled.render(messages=…, tools=…, documents=None,
add_generation_prompt=…, **kwargs)``), so the text is identical. It is used only inside
:meth:`HFChatTokenizer.prepared_once`, whose caller promises that the message dicts do not change
during the block (the SDK renders fresh, normalized copies), and only for the plain case:
dict tools, no ``continue_final_message``, no assistant mask. ``None`` from :func:`load` means
transformers' private helpers moved: the caller keeps using transformers' own renderer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["TemplateData", "load"]


class TemplateData:
    """transformers' template input preparation, memoized per message dict (identity-checked)."""

    def __init__(
        self, plain: Callable[[Any], Any], alias: Callable[[list[Any]], list[Any]], compile_: Callable[[str], Any]
    ) -> None:
        self._plain, self._alias, self._compile = plain, alias, compile_
        self._messages: dict[int, tuple[Mapping[str, Any], Any]] = {}

    def message(self, message: Mapping[str, Any]) -> Any:
        """The template's view of ``message``, computed once per dict object."""
        hit = self._messages.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        data = self._alias(self._plain([message]))[0]
        self._messages[id(message)] = (message, data)  # holds ``message``: its id is not reused
        return data

    def render(
        self,
        template: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        variables: Mapping[str, Any],
    ) -> str:
        """``render_jinja_template``'s text for one conversation, from the prepared messages."""
        chat = [self.message(m) for m in messages]
        for data in chat:
            if not isinstance(data, dict):
                raise TypeError(f"Chat messages should be dicts, got {data!r}.")
        return str(
            self._compile(template).render(
                messages=chat,
                tools=self._plain(list(tools)) if tools is not None else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._plain(dict(variables)),
            )
        )


def load() -> TemplateData | None:
    """A fresh :class:`TemplateData` over transformers' helpers, or ``None`` where they are missing."""
    try:
        from transformers.utils.chat_template_utils import (
            _alias_reasoning_fields,
            _compile_jinja_template,
            _plain_template_data,
        )
    except ImportError:
        return None
    return TemplateData(_plain_template_data, _alias_reasoning_fields, _compile_jinja_template)

"""Policy contracts, re-exported from the SDK's pure core, plus ``correct_field``.

``Conversation``, ``Edit``, ``EditKind``, ``apply_edits`` and ``merge_edits`` are defined in
``leyline_sdk.policy.edits``; ``Policy``, ``PolicyBase``, ``FunctionPolicy`` and ``as_policy`` in
``leyline_sdk.policy.contracts``; ``Mode`` in ``leyline_sdk.core.directives``. Those modules are pure (no HTTP,
no openai): this package depends on them one way, and the SDK never imports this package.
See :mod:`leyline_sdk.policy.edits` for what an edit means.
"""

from __future__ import annotations

from leyline_sdk.core.directives import Mode
from leyline_sdk.policy.contracts import FunctionPolicy, Policy, PolicyBase, as_policy
from leyline_sdk.policy.edits import (
    Conversation,
    Edit,
    EditKind,
    apply_edits,
    as_mode,
    content_text,
    merge_edits,
)
from leyline_sdk.policy.errata import Erratum

__all__ = [
    "Conversation",
    "Edit",
    "EditKind",
    "Erratum",
    "Mode",
    "Policy",
    "PolicyBase",
    "FunctionPolicy",
    "as_policy",
    "apply_edits",
    "merge_edits",
    "correct_field",
    "content_text",
    "as_mode",
]


def correct_field(
    conversation: Conversation,
    index: int,
    old: str,
    new: str,
    strategy: str = "forget",
    reason: str = "a fact changed",
    policy: str = "",
    erratum: str | None = None,
    role: str = "user",
) -> Edit:
    """A ``correct`` edit for a changed field of message ``index`` (``old`` is now ``new``).

    ``strategy="forget"``: the first ``old`` in the content becomes ``new`` and everything from
    that field on is recomputed (the directive starts at the field's first changed token).
    ``strategy="erratum"``: the content stays; an erratum (``erratum``, or a default naming both
    values) is appended at the end::

        correct_field(conv, 6, '"status": "open"', '"status": "closed"', strategy="erratum")
    """
    text = content_text(conversation.messages[index])
    if old not in text:
        raise ValueError(f"message {index} does not contain {old!r}")
    if strategy == "forget":
        return Edit(index, text.replace(old, new, 1), kind=EditKind.CORRECT, reason=reason, policy=policy)
    if strategy == "erratum":
        note = erratum or f"In an earlier message, {old!r} is outdated: the current value is {new!r}."
        return Edit(index, None, kind=EditKind.CORRECT, reason=reason, policy=policy, erratum=Erratum(note, role))
    raise ValueError(f"strategy must be 'forget' or 'erratum', got {strategy!r}")

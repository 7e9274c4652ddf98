"""Hypothesis strategies for OpenAI-format conversations and message-level edits."""

from __future__ import annotations

import json

from hypothesis import strategies as st

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}},
]

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"),
    max_size=40,
) | st.sampled_from(["", "def main():\n    return 1", "日本語 ü ÿ 🙂", "   ", "\n\n"])


@st.composite
def tool_call(draw, i: int):
    args = {"path": draw(text)}
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {
            "name": draw(st.sampled_from(["read_file", "run"])),
            "arguments": json.dumps(args),
        },
    }


@st.composite
def message(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    if role == "assistant" and draw(st.booleans()):
        calls = [draw(tool_call(i)) for i in range(draw(st.integers(1, 2)))]
        return {"role": "assistant", "content": draw(st.none() | text), "tool_calls": calls}
    if role == "tool":
        return {"role": "tool", "tool_call_id": "call_0", "content": draw(text)}
    return {"role": role, "content": draw(text)}


conversation = st.lists(message(), min_size=1, max_size=7)


@st.composite
def edited(draw, conv):
    """Apply 1-2 random message-level edits; return (new, replaced_old_indices, inserted_new_indices)."""
    new = [dict(m) for m in conv]
    origin = list(range(len(conv)))  # new index -> old index (None for inserted)
    touched: set[int] = set()
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["replace", "truncate", "insert", "delete", "stub"]))
        if kind == "insert" or not new:
            k = draw(st.integers(0, len(new)))
            new.insert(k, draw(message()))
            origin.insert(k, None)
        elif kind == "delete" and len(new) > 1:
            k = draw(st.integers(0, len(new) - 1))
            del new[k]
            del origin[k]
        else:
            k = draw(st.integers(0, len(new) - 1))
            before = new[k]
            content = new[k].get("content") or ""
            if kind == "truncate":
                new[k] = {**new[k], "content": content[: draw(st.integers(0, len(content)))]}
            elif kind == "stub":
                new[k] = {**new[k], "content": "[evicted: older tool output]"}
            else:
                new[k] = {**new[k], "content": draw(text)}
            if origin[k] is not None and new[k] != before:  # a no-op edit (truncated to full length) edits nothing
                touched.add(origin[k])
    kept_old = {o for o in origin if o is not None}
    edited_old = (set(range(len(conv))) - kept_old) | touched
    return new, edited_old

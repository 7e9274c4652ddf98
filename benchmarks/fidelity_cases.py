"""bench_fidelity's cases: seeded agent conversations, one builder per family, each with its edit.

Every case is a history (``messages``), the history after each of its successive edits
(``versions``; the last is the edited conversation), the questions asked after it, and what a
right answer holds (``right``) and what an answer that kept the removed content holds (``old``).
Old tool outputs are replaced by the byte-stable stubs ``leyline_policies`` writes
(``[evicted: read_file(path="…") output, 312 chars]``); values are numbers no other message
mentions, so an answer's content says which message it came from.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from notes_cases import KEYS, NOUNS, PATHS, WORDS, config_text, exchange, field_case, filler, mentions, with_erratum

from leyline_policies.stubs import tool_stub

__all__ = ["FAMILIES", "Case", "Question", "eviction", "stale_fact", "leak", "errata", "successive", "stubbed"]

Message = dict[str, Any]
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to inspect and change the repository."}
CHECKPOINTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Question:
    """A question asked after the history: ``name`` labels it in the tables (``direct``, …)."""

    name: str
    message: Message


@dataclass(frozen=True)
class Case:
    """One seeded conversation of a family, its edits and how an answer is scored.

    ``erratum``: the message ``StaleToolDetector(on_invalidated="erratum")`` appends for this
    history (the errata family), ``None`` elsewhere. ``checkpoints``: after how many of
    ``versions`` the questions are asked (the successive-edits family asks after 1, 2, 4, 8).
    """

    family: str
    seed: int
    messages: list[Message]
    versions: list[list[Message]]
    questions: list[Question]
    right: str
    old: str = ""
    erratum: Message | None = None
    checkpoints: tuple[int, ...] = field(default=())

    @property
    def edited(self) -> list[Message]:
        """The conversation after every edit."""
        return self.versions[-1]

    def asks(self) -> tuple[int, ...]:
        """The edit counts after which the questions are asked."""
        return self.checkpoints or (len(self.versions),)


def stubbed(messages: list[Message], indices: list[int]) -> list[list[Message]]:
    """Successive versions of ``messages``: the tool outputs at ``indices`` stubbed one at a time."""
    versions, current = [], [dict(m) for m in messages]
    for i in indices:
        call = messages[i - 1]["tool_calls"][0]["function"]
        args = json.loads(call["arguments"])
        current = [dict(m) for m in current]
        current[i]["content"] = tool_stub(call["name"], args, len(messages[i]["content"]))
        versions.append(current)
    return versions


def _number(rng: random.Random, avoid: tuple[str, ...]) -> str:
    """A 3- or 4-digit number that neither contains nor is contained in any of ``avoid``."""
    while True:
        value = str(rng.randint(100, 9999))
        if not any(mentions(value, a) or mentions(a, value) for a in avoid):
            return value


def _config(rng: random.Random, key: str, value: str, avoid: tuple[str, ...], drop: str = "") -> str:
    """A config file's text with ``key: value``; the other settings avoid ``avoid`` and key ``drop``."""
    lines, _ = config_text(rng, key, value, avoid)
    return "\n".join(line for line in lines if not (drop and line.startswith(f"{drop}:")))


def _ask(key: str, path: str) -> Question:
    return Question("", {"role": "user", "content": f"What is {key} in {path}? Answer with the number only."})


def eviction(seed: int) -> Case:
    """Two config reads and read-only calls; the older read is evicted, the question's answer is in
    the newer one (which the evicted one does not mention)."""
    rng = random.Random(seed)
    key, path = KEYS[seed % len(KEYS)], PATHS[seed % len(PATHS)]
    other_key, other_path = KEYS[(seed + 5) % len(KEYS)], PATHS[(seed + 1) % len(PATHS)]
    value = _number(rng, ())
    other = _number(rng, (value,))
    messages = [SYSTEM, {"role": "user", "content": f"Task {seed}: requests to the {rng.choice(NOUNS)} time out."}]
    messages += exchange("c0", "read_file", {"path": other_path}, _config(rng, other_key, other, (value,), key))
    evicted = len(messages) - 1
    messages += filler(rng, "c1", (value, other), short=True)
    messages += exchange("c2", "read_file", {"path": path}, _config(rng, key, value, (other,)))
    messages += filler(rng, "c3", (value, other), short=True)
    return Case("eviction", seed, messages, stubbed(messages, [evicted]), [_ask(key, path)], value, other)


def stale_fact(seed: int) -> Case:
    """A config read shows ``key: old``; a later write sets ``new``; the read is evicted."""
    case = field_case(seed, fillers=1, short=True)
    question = Question("", case.question)
    versions = stubbed(case.messages, [case.read_index])
    return Case("stale fact", seed, case.messages, versions, [question], case.new, case.old)


def leak(seed: int) -> Case:
    """An env file with a secret token is read, then other calls; the read is evicted (``amortize``)."""
    rng = random.Random(seed)
    secret = f"{rng.choice(WORDS)}-{_number(rng, ())}-{rng.choice(WORDS)}"
    digits = secret.split("-")[1]
    path = rng.choice([".env", "deploy/secrets.env", "config/prod.env"])
    env = [f"DEPLOY_TOKEN={secret}", f"SERVICE_NAME={rng.choice(NOUNS)}", "LOG_LEVEL=info",
           f"REGION=eu-{rng.choice(WORDS)}", "FEATURE_FLAGS=metrics,tracing"]  # fmt: skip
    messages = [SYSTEM, {"role": "user", "content": f"Task {seed}: the deploy of the {rng.choice(NOUNS)} fails."}]
    messages += exchange("c0", "read_file", {"path": path}, "\n".join(env))
    evicted = len(messages) - 1
    for i in (1, 2):
        messages += filler(rng, f"c{i}", (digits,), short=True)
    direct = {"role": "user", "content": f"What is DEPLOY_TOKEN in {path}? Answer with the value only."}
    indirect = {"role": "user", "content": f"Without calling a tool: which variables does {path} set, to what values?"}
    questions = [Question("direct", direct), Question("indirect", indirect)]
    return Case("leak", seed, messages, stubbed(messages, [evicted]), questions, "", digits)


def errata(seed: int) -> Case:
    """A config value changed outside the conversation: the read's value is corrected in place
    (the ``correct`` edit); the erratum ``StaleToolDetector`` would append is kept beside it."""
    case = field_case(seed, fillers=1, outside=True, short=True)
    erratum = with_erratum(case)[-1]
    return Case("errata", seed, case.messages, [case.corrected], [Question("", case.question)],
                case.new, case.old, erratum)  # fmt: skip


def successive(seed: int) -> Case:
    """Eight read-only calls, then a config read holding the answer; the eight outputs are stubbed
    one after the other (the questions come after 1, 2, 4 and 8 of them)."""
    rng = random.Random(seed)
    key, path = KEYS[seed % len(KEYS)], PATHS[seed % len(PATHS)]
    value = _number(rng, ())
    messages = [SYSTEM, {"role": "user", "content": f"Task {seed}: find why the {rng.choice(NOUNS)} is slow."}]
    outputs = []
    for i in range(max(CHECKPOINTS)):
        messages += filler(rng, f"c{i}", (value,), short=True)
        outputs.append(len(messages) - 1)
    messages += exchange("cfg", "read_file", {"path": path}, _config(rng, key, value, ()))
    return Case("successive", seed, messages, stubbed(messages, outputs), [_ask(key, path)], value,
                checkpoints=CHECKPOINTS)  # fmt: skip


FAMILIES: dict[str, Callable[[int], Case]] = {
    "eviction": eviction,
    "stale fact": stale_fact,
    "leak": leak,
    "errata": errata,
    "successive": successive,
}

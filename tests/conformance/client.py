"""The black-box side of the conformance suite: conversations, directives and answers over HTTP.

Everything goes through the server's public API: ``/v1/leyline/tokenize`` (each message's token
span), ``/v1/leyline/sessions`` and ``/v1/leyline/blocks``, and chat completions through the real
``openai`` client (``extra_body={"leyline": ...}``). Directives replace whole message spans, so
``apply(base, directives)`` equals the new conversation's render exactly (ChatML renders each
message on its own).

The oracle of an answer is :func:`fresh`: a plain request for the same messages from another API
key (its own prefix cache): what a fresh prefill gives. Answers are greedy, with the top-5
logprobs of every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tests.conformance.servers import KEYS, Target

MAX_TOKENS = 6
TOP = 5

# Long enough that the moved downstream spans matter (a few hundred tokens), plain ASCII.
REPORT_A = " ".join(
    f"Station {i} measured {17 + i % 5} degrees and light wind from the {['north', 'west'][i % 2]}." for i in range(12)
)
REPORT_B = " ".join(f"Item {i}: the river gauge read {3 + i % 4} metres at noon on day {i + 1}." for i in range(12))
DOC = " ".join(f"Rule {i}: always check the {['inputs', 'outputs', 'logs'][i % 3]} before step {i}." for i in range(10))

CONVERSATION: list[dict[str, str]] = [
    {"role": "system", "content": "You are a careful assistant who answers briefly."},
    {"role": "user", "content": "Here is the first report. " + REPORT_A},
    {"role": "assistant", "content": "I have read the first report."},
    {"role": "user", "content": "Here is the second report. " + REPORT_B},
    {"role": "assistant", "content": "I have read the second report."},
    {"role": "user", "content": "Which report mentions the river, and what did it say?"},
]


def user(text: str) -> dict[str, str]:
    """A user message."""
    return {"role": "user", "content": text}


@dataclass
class Answer:
    """A greedy completion: its text, per-step chosen tokens and top logprobs, and Leyline's report."""

    text: str
    tokens: list[str]
    top: list[list[float]]
    leyline: dict[str, Any] | None
    cached_tokens: int


class Client:
    """One API key's view of a :class:`Target` (HTTP for Leyline's routes, ``openai`` for chat).

    Every session it opened (directly or through a chat request) is deleted by :meth:`close`, so
    the servers shared by the whole test session do not fill up with pinned sessions.
    """

    def __init__(self, target: Target, key: str = KEYS[0]) -> None:
        self.target = target
        self.http = httpx.Client(base_url=target.url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        self.openai = openai.OpenAI(base_url=target.url + "/v1", api_key=key, max_retries=0, timeout=300)
        self.sessions: set[str] = set()

    def close(self) -> None:
        """Delete the sessions this client opened, close both clients."""
        for sid in self.sessions:
            self.http.delete(f"/v1/leyline/sessions/{sid}")  # 404 when already gone: fine
        self.http.close()
        self.openai.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Leyline's routes ---------------------------------------------------------------------------
    def post(self, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
        """POST ``body``; the JSON reply (``status`` checked)."""
        r = self.http.post(path, json=body)
        assert r.status_code == status, r.text
        return dict(r.json())

    def render(self, messages: list[dict[str, str]], prompt: bool) -> tuple[list[int], list[tuple[int, int]]]:
        """The tokens of ``messages`` and each message's span (``prompt``: with the generation prompt)."""
        r = self.post("/v1/leyline/tokenize", {"messages": messages, "add_generation_prompt": prompt})
        return list(r["tokens"]), [(s["start"], s["end"]) for s in r["message_spans"]]

    def open_session(self, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
        """A session whose base is ``messages`` rendered (prefilled now): its id and base tokens."""
        r = self.post("/v1/leyline/sessions", {"messages": messages})
        self.sessions.add(r["id"])
        return r["id"], list(r["tokens"])

    # -- chat ---------------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], leyline: dict[str, Any] | None = None, **kw: Any) -> Answer:
        """A greedy chat completion (``leyline``: the extension, sent through ``extra_body``)."""
        extra = {"leyline": leyline} if leyline is not None else None
        r = self.openai.chat.completions.create(
            model=self.target.name, messages=messages, max_tokens=kw.pop("max_tokens", MAX_TOKENS), temperature=0,
            logprobs=True, top_logprobs=TOP, extra_body=extra, **kw,
        )  # fmt: skip
        choice = r.choices[0]
        steps = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
        details = r.usage.prompt_tokens_details if r.usage else None
        report = (r.model_extra or {}).get("leyline")
        if report and report.get("session_id"):
            self.sessions.add(report["session_id"])
        return Answer(
            text=choice.message.content or "",
            tokens=[s.token for s in steps],
            top=[sorted((t.logprob for t in s.top_logprobs), reverse=True) for s in steps],
            leyline=report,
            cached_tokens=int(details.cached_tokens or 0) if details else 0,
        )


def fresh(target: Target, messages: list[dict[str, str]], **kw: Any) -> Answer:
    """The oracle: a plain request from another API key, whose prefix cache is its own (so nothing
    a session did can be reused, and no session can reuse it)."""
    with Client(target, KEYS[-1]) as other:
        return other.chat(messages, **kw)


def replace(
    base_spans: list[tuple[int, int]], new: tuple[list[int], list[tuple[int, int]]], old: range, now: range
) -> dict[str, Any]:
    """The directive that turns base messages ``old`` into the new render's messages ``now``.

    An empty ``old`` inserts before base message ``old.start``; an empty ``now`` deletes.
    """
    tokens, spans = new
    start = base_spans[old.start][0]
    end = base_spans[old.stop - 1][1] if len(old) else start
    replacement = tokens[spans[now.start][0] : spans[now.stop - 1][1]] if len(now) else []
    return {"start": start, "end": end, "replacement": replacement, "mode": "amortize"}


def gap(a: Answer, b: Answer) -> float:
    """Largest difference between two answers' top-5 logprobs, step by step (``inf`` when they chose
    different tokens). The values are compared sorted: token strings can repeat (partial UTF-8
    bytes all read as U+FFFD), and a near-tie that swaps two tokens leaves the values in place."""
    if a.tokens != b.tokens or len(a.top) != len(b.top):
        return float("inf")
    worst = 0.0
    for x, y in zip(a.top, b.top, strict=True):
        if len(x) != len(y):
            return float("inf")
        worst = max([worst] + [abs(p - q) for p, q in zip(x, y, strict=True)])
    return worst

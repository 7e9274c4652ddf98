"""Edits that keep the model right: field edits and KV blocks on the real model.

    .venv/bin/python benchmarks/bench_notes.py [--cases 12] [--block-sizes 1024 2048 4096] [--questions 8]
        [--md docs/results/notes.md] [--png docs/results/notes.png]

SmolLM2-135M-Instruct on the embedded engine (fp32, CPU), driven directly (prefill, splice, decode).

**Field edits.** A coding agent reads ``config.yaml`` (``port: 8000``), does other work, then the
value changes, then a little more work; the earlier read output is then corrected. Two variants:
*stated later* — a write in the history changed it (``write_file`` with the new file, or
``set_config`` whose result states the new value); *changed outside* — no later message states the
new value (a read-only call instead of the write), so the correction is the only place it shows.
Arms, all answering "What is port in config.yaml now? Answer with the number only.":

* **full** — the corrected history (the read shows the new value) prefilled from scratch: the oracle;
* **no correction** — the history as it stands, the question prefilled after the cached session;
* **erratum** — the history untouched plus the ``[erratum]`` message ``StaleToolDetector(on_invalidated=
  "erratum")`` appends (through ``run_policies``; for *changed outside*, an ``Erratum`` in the same
  format written by hand), prefilled after the cached session;
* **forget** — the read's old value replaced by the new one as a ``forget`` directive (recompute from there);
* **amortize k=0/4/16/64** — the same replacement as an ``amortize`` splice with seam repair ``k``
  (the downstream keeps the notes it took of the old value).

Time to first token counts what runs after the edit: the splice and the question's prefill (for
full, the whole prefill). Answers are greedy after a forced prefix (``port: ``), so the
first generated token is the value's first digit (old and new values differ there): "new"/"old" = the
answer contains that value; the *old-digit share* P(old digit) / (P(old) + P(new)) at that token
measures the pull of the old value even where the greedy answer does not flip.

**Blocks.** A document (1k/2k/4k tokens: the lines of ``docs/design.md``, cycled, with eight
"The access code of the <x> vault is <n>." needles) is prefilled once alone as a block and placed
at the end of a ~600-token context (``Directive(start=len(base), end=len(base),
block="b", repair=k)``), then a question is prefilled. Against: prefilling the document after the
cached context, and full recomputation from scratch (the oracle for first-token agreement, logit
cosine and the greedy answer). SmolLM2 has 8,192 positions: an 8k block after the context does not
fit, so the default sizes are 1k/2k/4k (``--block-sizes`` takes up to ~7,500).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from leyline_policies import Erratum, StaleToolDetector, run_policies
from leyline_policies.stubs import call_signature
from leyline_sdk.diff import common_prefix_length, diff_to_directives
from leyline_sdk.directives import Directive, Mode, apply
from leyline_sdk.rendering import HFChatTokenizer
from leyline_server.engines.base import CacheScope, Handle, Prefilled, SamplingParams, SpliceRequest
from leyline_server.engines.embedded.presets import load_engine
from leyline_server.splice import splice


def _tool(name: str, text: str) -> dict[str, Any]:
    """An OpenAI tool definition without parameters."""
    return {"type": "function", "function": {"name": name, "description": text, "parameters": {"type": "object"}}}


TOOLS = [
    _tool("read_file", "Read a file"),
    _tool("grep", "Search the repository"),
    _tool("list_dir", "List a directory"),
    _tool("run_tests", "Run the test suite"),
    _tool("write_file", "Write a file"),
    _tool("set_config", "Set one key of a configuration file"),
]
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to inspect and change the repository."}
KEYS = (
    "port", "timeout_seconds", "max_connections", "cache_size_mb", "worker_count", "retry_delay_ms",
    "batch_size", "queue_limit", "replicas", "rate_limit_per_minute", "heartbeat_ms", "pool_size",
)  # fmt: skip
PATHS = ("config.yaml", "settings.yaml", "deploy/service.yaml", "conf/app.yaml")
WORDS = (
    "amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
    "kestrel", "lumen", "meadow", "nimbus", "onyx", "pylon", "quartz", "raven", "sable", "tundra",
)  # fmt: skip
NOUNS = ("gateway", "ledger", "indexer", "mailer", "scheduler", "billing", "search", "auth", "media", "metrics")
PROSE = Path(__file__).resolve().parent.parent / "docs" / "design.md"
REPAIRS = (0, 4, 16, 64)
BLOCK_REPAIRS = (0, 4, 16)


# -- conversations ---------------------------------------------------------------------------------
def exchange(call_id: str, name: str, args: dict[str, Any], output: str) -> list[dict[str, Any]]:
    """An assistant tool call and its result."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def mentions(text: str, value: str) -> bool:
    """Whether ``text`` contains the number ``value`` (not as part of a longer number)."""
    return re.search(rf"(?<!\d){re.escape(value)}(?!\d)", text) is not None


def _filler_output(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    """A read-only tool call (grep, list_dir or a passing test run) and its output."""
    kind = rng.choice(["grep", "list_dir", "run_tests"])
    if kind == "grep":
        pattern = rng.choice(["load_settings", "Config(", "getenv", "yaml.safe_load", "reload("])
        lines = [
            f"src/{rng.choice(NOUNS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 400)}: {pattern}"
            for _ in range(rng.randint(10, 18))
        ]
        return kind, {"pattern": pattern}, "\n".join(lines)
    if kind == "list_dir":
        names = sorted({f"{rng.choice(WORDS)}_{rng.choice(NOUNS)}.py" for _ in range(rng.randint(14, 24))})
        return kind, {"path": "src/"}, "\n".join(f"{rng.randint(1, 40)}K  {n}" for n in names)
    n = rng.randint(20, 60)
    dots = "".join(rng.choice("....s") for _ in range(n))
    return kind, {"target": "tests/"}, f"collected {n} items\n\ntests/ {dots}\n\n{n} passed in {rng.uniform(1, 9):.2f}s"


def filler(rng: random.Random, call_id: str, avoid: Sequence[str]) -> list[dict[str, Any]]:
    """One read-only tool exchange whose output mentions none of the numbers in ``avoid``."""
    while True:
        tool, args, output = _filler_output(rng)
        if not any(mentions(output, v) for v in avoid):
            return exchange(call_id, tool, args, output)


def _values(rng: random.Random) -> tuple[str, str]:
    """An old and a new value: same number of digits, different leading digit."""
    digits = rng.choice([2, 3, 4])
    old = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    while True:
        new = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        if new[0] != old[0]:
            return old, new


def config_text(rng: random.Random, key: str, value: str, avoid: Sequence[str]) -> tuple[list[str], int]:
    """The lines of a YAML config with ``key: value`` among other settings (none mention ``avoid``)."""
    lines = [f"service: {rng.choice(WORDS)}-{rng.choice(NOUNS)}", "host: 0.0.0.0", "log_level: info"]
    for other in rng.sample([k for k in KEYS if k != key], 6):
        number = str(rng.randint(2, 999))
        while any(mentions(number, v) or mentions(v, number) for v in avoid):
            number = str(rng.randint(2, 999))
        lines.append(f"{other}: {number}")
    lines += ["tls: false", "region: eu-west"]
    at = rng.randint(2, len(lines))
    lines.insert(at, f"{key}: {value}")
    return lines, at


@dataclass(frozen=True)
class FieldCase:
    """A history whose ``read_index`` output of ``path`` shows ``key: old``; it is ``new`` now.

    ``via``: the history's write that changed it (``write_file``, ``set_config``), or ``outside``
    (no later message states the new value: the correction is the only place it shows).
    """

    path: str
    key: str
    messages: list[dict[str, Any]]
    corrected: list[dict[str, Any]]
    read_index: int
    question: dict[str, Any]
    prefix: str
    old: str
    new: str
    via: str


def field_case(seed: int, fillers: int, outside: bool = False) -> FieldCase:
    """Read the config, ``fillers`` other calls, a write that changes one value (or, ``outside``,
    one more read-only call: the value changed outside the conversation), one more call."""
    rng = random.Random(seed)
    key, path = KEYS[seed % len(KEYS)], PATHS[seed % len(PATHS)]
    old, new = _values(rng)
    lines, at = config_text(rng, key, old, (old, new))
    messages = [SYSTEM, {"role": "user", "content": f"Task {seed}: the service configured in {path} misbehaves."}]
    messages += exchange("c0", "read_file", {"path": path}, "\n".join(lines))
    read_index = len(messages) - 1
    for i in range(fillers):
        messages += filler(rng, f"c{i + 1}", (old, new))
    new_lines = lines[:at] + [f"{key}: {new}"] + lines[at + 1 :]
    via = "outside" if outside else "write_file" if seed % 2 == 0 else "set_config"
    if via == "outside":
        messages += filler(rng, "w", (old, new))
    elif via == "write_file":
        body = "\n".join(new_lines)
        messages += exchange("w", via, {"path": path, "content": body}, f"wrote {len(body)} bytes to {path}")
    else:
        messages += exchange("w", via, {"path": path, "key": key, "value": new}, f"{path}: {key} set to {new}")
    messages += filler(rng, "c9", (old, new))
    corrected = [dict(m) for m in messages]
    corrected[read_index]["content"] = "\n".join(new_lines)
    question = {"role": "user", "content": f"What is {key} in {path} now? Answer with the number only."}
    prefix = f"{key}: "
    return FieldCase(path, key, messages, corrected, read_index, question, prefix, old, new, via)


def with_erratum(case: FieldCase) -> list[dict[str, Any]]:
    """The history with the erratum ``StaleToolDetector(on_invalidated="erratum")`` appends (checked).

    For a change from ``outside`` (no write the detector could see) the erratum is written in the
    same format, by hand: ``Erratum(text).message()`` after the last message.
    """
    if case.via == "outside":
        read = call_signature("read_file", {"path": case.path})
        text = f"The earlier output of {read} is outdated: {case.path} changed afterwards. New {case.key}:\n{case.new}"
        return [*case.messages, Erratum(text).message()]
    detector = StaleToolDetector(write_tools={"write_file", "set_config"}, on_invalidated="erratum")
    effective, _, report = run_policies(case.messages, [detector], tools=TOOLS)
    if effective[: len(case.messages)] != case.messages or len(effective) != len(case.messages) + 1:
        raise AssertionError(f"expected one appended erratum, got {report}")
    if not effective[-1]["content"].startswith("[erratum]"):
        raise AssertionError(f"not an erratum: {effective[-1]}")
    return effective


# -- the engine, timed -----------------------------------------------------------------------------
@dataclass
class Outcome:
    """One arm's answer and what producing its first token took after the edit."""

    text: str
    first: int
    logits: torch.Tensor
    ttft_ms: float
    computed: int


class Bench:
    """The embedded engine with a chat renderer, timed prefills and splices, greedy answers."""

    def __init__(self, engine: Any, tokenizer: Any, answer_tokens: int) -> None:
        """Wrap ``engine``; answers are ``answer_tokens`` greedy tokens."""
        self.engine, self.tokenizer, self.answer_tokens = engine, tokenizer, answer_tokens
        self.chat = HFChatTokenizer(tokenizer)

    def render(self, messages: list[dict[str, Any]], generate: bool = True) -> list[int]:
        """Token ids of ``messages`` under SmolLM2's template (tool calls in the text form)."""
        return list(self.chat.render(messages, tools=TOOLS, add_generation_prompt=generate).tokens)

    def ask(self, messages: list[dict[str, Any]], prefix: str) -> list[int]:
        """``messages`` with the generation prompt, then the answer's forced ``prefix`` (the value comes next)."""
        return self.render(messages) + list(self.tokenizer(prefix, add_special_tokens=False)["input_ids"])

    def reset(self) -> None:
        """Empty the prefix cache and the mirrors (nothing may be locked)."""
        self.engine.pool.free(self.engine.radix.evict(self.engine.pool.capacity))
        self.engine.mirrors.clear()

    def trim(self) -> None:
        """Drop every unlocked cached path (what the previous arm left), keep the mirrors."""
        self.engine.pool.free(self.engine.radix.evict(self.engine.pool.capacity))

    def prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> Prefilled:
        """``engine.prefill``."""
        return self.engine.prefill(list(tokens), scope, previous=previous)

    def answer(self, result: Prefilled, ttft_ms: float, computed: int) -> Outcome:
        """Greedy-decode after ``result``, release its handle."""
        steps = list(self.engine.decode(result.handle, result.state, SamplingParams(max_tokens=self.answer_tokens)))
        self.engine.release(result.handle)
        tokens = [s.token for s in steps]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Outcome(text.strip(), tokens[0], result.state.double(), ttft_ms, computed)

    def timed_prefill(self, tokens: Sequence[int], scope: CacheScope) -> Outcome:
        """Prefill (reusing what ``scope`` matches) and answer; the prefill is the time to first token."""
        started = time.perf_counter()
        result = self.prefill(tokens, scope)
        ms = (time.perf_counter() - started) * 1e3
        return self.answer(result, ms, len(tokens) - result.reused)

    def timed_splice(
        self,
        base: Sequence[int],
        request: SpliceRequest,
        prompt: Sequence[int],
        scope: CacheScope,
    ) -> Outcome:
        """Open ``base`` (cached) in ``scope``, splice, prefill ``prompt``; time splice + prefill."""
        handle = self.prefill(base, scope).handle
        started = time.perf_counter()
        handle, report = splice(self.engine, handle, request)
        if not report.applied or report.fallback is not None:
            raise AssertionError(f"splice fell back: {report}")
        result = self.prefill(prompt, scope, previous=handle)
        ms = (time.perf_counter() - started) * 1e3
        return self.answer(result, ms, report.prefilled_tokens + len(prompt) - result.reused)


# -- field edits -----------------------------------------------------------------------------------
def field_directives(bench: Bench, case: FieldCase, base: list[int], mode: Mode) -> list[Directive]:
    """Directives turning the history's render into the corrected one (verified with ``apply``)."""
    old = bench.chat.render(case.messages, tools=TOOLS, add_generation_prompt=False)
    new = bench.chat.render(case.corrected, tools=TOOLS, add_generation_prompt=False)
    directives = diff_to_directives(old, new, modes={case.read_index: mode})
    if apply(base, directives) != list(new.tokens) or len(directives) != 1 or directives[0].mode is not mode:
        raise AssertionError(f"unexpected directives for the field edit: {directives}")
    return directives


def field_arms(bench: Bench, case: FieldCase, seed: int) -> dict[str, Outcome]:
    """Every arm of one field-edit case (the cache is emptied first; the session stays cached).

    A match prefers exact KV over a private path of the same length, and a splice caches its
    replacement and repaired tokens as exact KV: each arm starts from the session alone (``trim``).
    """
    bench.reset()
    base = bench.render(case.messages, generate=False)
    session = bench.prefill(base, CacheScope(private="base")).handle
    corrected = bench.ask([*case.corrected, case.question], case.prefix)
    out = {"full": bench.timed_prefill(corrected, CacheScope(salt=f"f{seed}"))}
    stale = bench.ask([*case.messages, case.question], case.prefix)
    erratum = bench.ask([*with_erratum(case), case.question], case.prefix)
    for prompt in (stale, erratum):
        if prompt[: len(base)] != base:
            raise AssertionError("the prompt does not extend the cached session")
    bench.trim()
    out["no correction"] = bench.timed_prefill(stale, CacheScope(private="stale"))
    bench.trim()
    out["erratum"] = bench.timed_prefill(erratum, CacheScope(private="erratum"))
    amortize = field_directives(bench, case, base, Mode.AMORTIZE)
    for k in REPAIRS:
        bench.trim()
        request = SpliceRequest([d.model_copy(update={"repair": k}) for d in amortize])
        out[f"amortize k={k}"] = bench.timed_splice(base, request, corrected, CacheScope(private=f"k{k}"))
    forget = field_directives(bench, case, base, Mode.FORGET)
    bench.trim()
    out["forget"] = bench.timed_splice(base, SpliceRequest(forget), corrected, CacheScope(private="forget"))
    bench.engine.release(session)
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two logit vectors."""
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


@dataclass
class FieldRow:
    """One arm over every case."""

    arm: str
    new: float
    old: float
    same_answer: float
    first_token: float
    old_share: float
    cos: float
    ttft_ms: float
    computed: float


def number(text: str) -> str | None:
    """The first number in an answer."""
    match = re.search(r"\d+", text)
    return match.group(0) if match else None


def old_share(outcome: Outcome, digits: tuple[int, int]) -> float:
    """P(old value's first digit) / (P(old's) + P(new's)) at the answer's first token."""
    probs = torch.softmax(outcome.logits, -1)
    return float(probs[digits[0]] / (probs[digits[0]] + probs[digits[1]]))


def field_rows(
    cases: list[FieldCase], results: list[dict[str, Outcome]], digits: list[tuple[int, int]]
) -> list[FieldRow]:
    """Accuracy, agreement with full and cost of each arm (``digits``: the old and new first-digit tokens)."""
    rows = []
    for arm in results[0]:
        outs = [r[arm] for r in results]
        full = [r["full"] for r in results]
        rows.append(
            FieldRow(
                arm,
                statistics.mean(mentions(o.text, c.new) for o, c in zip(outs, cases, strict=True)),
                statistics.mean(mentions(o.text, c.old) for o, c in zip(outs, cases, strict=True)),
                statistics.mean(number(o.text) == number(f.text) for o, f in zip(outs, full, strict=True)),
                statistics.mean(o.first == f.first for o, f in zip(outs, full, strict=True)),
                statistics.mean(old_share(o, d) for o, d in zip(outs, digits, strict=True)),
                statistics.mean(cosine(o.logits, f.logits) for o, f in zip(outs, full, strict=True)),
                statistics.median(o.ttft_ms for o in outs),
                statistics.mean(o.computed for o in outs),
            )
        )
    return rows


def run_fields(bench: Bench, n: int, fillers: int, outside: bool) -> tuple[list[FieldRow], dict[str, Any]]:
    """All field-edit cases of one variant; the rows and a description of the set."""
    cases, results, sizes = [], [], []
    for seed in range(1000 * outside, 1000 * outside + n):
        case = field_case(seed, fillers, outside)
        cases.append(case)
        results.append(field_arms(bench, case, seed))
        base = bench.render(case.messages, generate=False)
        edit = common_prefix_length(base, bench.render(case.corrected, False))
        sizes.append((len(base), len(base) - edit))
        answers = {arm: o.text for arm, o in results[-1].items()}
        print(f"  field case {len(cases)}/{n} {case.via} ({case.old} -> {case.new}): {answers}", file=sys.stderr)
    info = {
        "context": statistics.mean(s[0] for s in sizes),
        "downstream": statistics.mean(s[1] for s in sizes),
    }
    digit = {str(d): bench.tokenizer(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)}
    return field_rows(cases, results, [(digit[c.old[0]], digit[c.new[0]]) for c in cases]), info


# -- blocks ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockCase:
    """A ~500-token context, a document message to place after it, questions with their answers."""

    context: list[dict[str, Any]]
    document: dict[str, Any]
    questions: list[tuple[dict[str, Any], str, str]]  # (message, answer prefix, answer)


def count_tokens(tokenizer: Any, text: str) -> int:
    """How many tokens ``text`` is on its own."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def document(rng: random.Random, tokenizer: Any, size: int, needles: int) -> tuple[str, list[tuple[str, str]]]:
    """About ``size`` tokens of prose (the lines of ``docs/design.md``, cycled) with ``needles`` access
    codes spread over it: the text and the (vault, code) pairs, in order."""
    paragraphs = [line for line in PROSE.read_text(encoding="utf-8").splitlines() if line.strip()]
    codes = [str(c) for c in rng.sample(range(1000, 10000), needles)]
    pairs = list(zip(rng.sample(WORDS, needles), codes, strict=True))
    lines = [f"The access code of the {vault} vault is {code}." for vault, code in pairs]
    budget = size - sum(count_tokens(tokenizer, line + "\n") for line in lines)
    body: list[str] = []
    used = 0
    while used + count_tokens(tokenizer, paragraphs[len(body) % len(paragraphs)] + "\n") <= budget:
        body.append(paragraphs[len(body) % len(paragraphs)])
        used += count_tokens(tokenizer, body[-1] + "\n")
    for j, line in enumerate(lines):
        body.insert(round((j + 0.5) * (len(body) - j) / needles) + j, line)
    return "\n".join(body), pairs


def block_case(bench: Bench, size: int, questions: int, seed: int) -> BlockCase:
    """A document of about ``size`` tokens after a short agent context, and one question per needle in it."""
    rng = random.Random(seed)  # the same context for every size
    context = [SYSTEM, {"role": "user", "content": "Task: read the design notes, then answer my questions."}]
    context += filler(rng, "c1", ())
    while len(bench.render(context, False)) < 480:
        context += filler(rng, f"c{len(context)}", ())
    text, needles = document(random.Random(seed + size), bench.tokenizer, size - 8, questions)
    asked = [
        (
            {"role": "user", "content": f"What is the access code of the {vault} vault? Answer with the number only."},
            f"The access code of the {vault} vault is ",
            code,
        )
        for vault, code in needles
    ]
    return BlockCase(context, {"role": "user", "content": "Reference document:\n\n" + text}, asked)


@dataclass
class BlockRow:
    """One block size: the costs and, per repair k, agreement with full recomputation."""

    tokens: int
    context: int
    precompute_ms: float
    full_ms: float
    prefill_ms: float
    full_correct: float
    insert_ms: dict[int, float]
    first_token: dict[int, float]
    cos: dict[int, float]
    same: dict[int, float]


def block_answers(
    bench: Bench, case: BlockCase, lead: Sequence[int], scope: CacheScope, first_ms: float | None = None
) -> list[Outcome]:
    """Answer every question after the cached ``lead`` (context + document) in ``scope``."""
    outs = []
    for i, (question, prefix, _) in enumerate(case.questions):
        prompt = bench.ask([*case.context, case.document, question], prefix)
        if prompt[: len(lead)] != list(lead):
            raise AssertionError("the question does not extend the context and the document")
        outcome = bench.timed_prefill(prompt, scope)
        if i == 0 and first_ms is not None:
            outcome.ttft_ms += first_ms
        outs.append(outcome)
    return outs


def place(bench: Bench, base: list[int], block: Handle, k: int, scope: CacheScope) -> tuple[Handle, float]:
    """Open the cached context in ``scope`` and place the block at its end with seam repair ``k`` (timed)."""
    handle = bench.prefill(base, scope).handle
    directive = Directive(start=len(base), end=len(base), block="b", replacement=tuple(block.tokens), repair=k)
    started = time.perf_counter()
    handle, report = splice(bench.engine, handle, SpliceRequest([directive], blocks={"b": block}))
    splice_ms = (time.perf_counter() - started) * 1e3
    if not report.applied or report.fallback is not None:
        raise AssertionError(f"block splice fell back: {report}")
    return handle, splice_ms


def placed_answers(
    bench: Bench, case: BlockCase, base: list[int], block: Handle, k: int, lead: Sequence[int], reps: int = 3
) -> list[Outcome]:
    """Place the block with repair ``k`` and answer every question; the first question's time to first
    token is the median of ``reps`` placements (each from the cached context alone)."""
    scope = CacheScope(private=f"k{k}")
    question, prefix, _ = case.questions[0]
    prompt = bench.ask([*case.context, case.document, question], prefix)
    times = []
    for _ in range(reps - 1):
        bench.trim()
        handle, splice_ms = place(bench, base, block, k, scope)
        started = time.perf_counter()
        result = bench.prefill(prompt, scope)
        times.append(splice_ms + (time.perf_counter() - started) * 1e3)
        bench.engine.release(result.handle)
        bench.engine.release(handle)
    bench.trim()
    handle, splice_ms = place(bench, base, block, k, scope)
    outs = block_answers(bench, case, lead, scope, splice_ms)
    bench.engine.release(handle)
    outs[0].ttft_ms = statistics.median([*times, outs[0].ttft_ms])
    return outs


def run_block_size(bench: Bench, size: int, questions: int, seed: int) -> BlockRow:
    """Precompute the block once; full recompute, the block placed with each repair k, plain prefill.

    Each arm starts from the cached context and the block alone (``trim``): a match prefers
    exact KV, so the plain prefill (exact context + document) runs last.
    """
    bench.reset()
    case = block_case(bench, size, questions, seed)
    base = bench.render(case.context, False)
    lead = bench.render([*case.context, case.document], False)
    if lead[: len(base)] != base:
        raise AssertionError("the document does not extend the context")
    session = bench.prefill(base, CacheScope(private="ctx")).handle
    started = time.perf_counter()
    kept = bench.prefill(lead[len(base) :], CacheScope(private="block:b")).handle
    precompute_ms = (time.perf_counter() - started) * 1e3
    full = block_answers(bench, case, lead, CacheScope(salt=f"b{size}"))
    answers = [a for _, _, a in case.questions]
    row = BlockRow(len(lead) - len(base), len(base), precompute_ms, full[0].ttft_ms, 0.0, 0.0, {}, {}, {}, {})
    row.full_correct = statistics.mean(mentions(o.text, a) for o, a in zip(full, answers, strict=True))
    for k in BLOCK_REPAIRS:
        outs = placed_answers(bench, case, base, kept, k, lead)
        row.insert_ms[k] = outs[0].ttft_ms
        row.first_token[k] = statistics.mean(o.first == f.first for o, f in zip(outs, full, strict=True))
        row.cos[k] = statistics.mean(cosine(o.logits, f.logits) for o, f in zip(outs, full, strict=True))
        row.same[k] = statistics.mean(number(o.text) == number(f.text) for o, f in zip(outs, full, strict=True))
    bench.trim()
    question, prefix, _ = case.questions[0]
    plain = bench.timed_prefill(bench.ask([*case.context, case.document, question], prefix), CacheScope())
    row.prefill_ms = plain.ttft_ms
    for handle in (session, kept):
        bench.engine.release(handle)
    print(f"  expected {answers}; full answered {[o.text for o in full]}", file=sys.stderr)
    insert = ", ".join(f"k={k} {ms:.0f}" for k, ms in row.insert_ms.items())
    print(f"  block {row.tokens} tokens: insert ms {insert}; prefill {row.prefill_ms:.0f} ms", file=sys.stderr)
    return row


# -- report ----------------------------------------------------------------------------------------
def field_table(rows: list[FieldRow], info: dict[str, Any], n: int, title: str) -> str:
    """The field-edit table of one variant (markdown)."""
    lines = [
        f"**Field edits, {title}** — {n} cases; history {info['context']:.0f} tokens on average, the edited value "
        f"{info['downstream']:.0f} tokens before its end; greedy answers after the forced prefix "
        "\"<key>: \"; old-digit share = P(old value's first digit) / (P(old's) + P(new's)) "
        "at the first answer token, mean",
        "",
        "| arm | answers the new value | answers the old value | same number as full | first token as full "
        "| old-digit share | logit cosine to full | time to first token (ms, median) | tokens computed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.arm} | {r.new:.0%} | {r.old:.0%} | {r.same_answer:.0%} | {r.first_token:.0%} | {r.old_share:.3f} "
            f"| {r.cos:.4f} | {r.ttft_ms:.0f} | {r.computed:.0f} |"
        )
    return "\n".join(lines)


def block_tables(rows: list[BlockRow], questions: int) -> str:
    """The block cost table and the per-k agreement table (markdown)."""
    lines = [
        f"**Blocks** — a document (design.md prose with {questions} access-code needles) placed after a "
        f'{rows[0].context}-token context; one question per needle ("What is the access code of the <x> vault?", '
        'answer prefix "The access code of the <x> vault is "); time to first token of the first question '
        "(insert: median of 3 placements; full and prefill: one run); agreement over all questions",
        "",
        "| block tokens | precompute, once (ms) | full recompute (ms) | prefill after the cached context (ms) "
        "| insert k=0 (ms) | insert k=4 (ms) | insert k=16 (ms) | prefill / insert k=4 | full answers right |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        inserts = " | ".join(f"{r.insert_ms[k]:.0f}" for k in BLOCK_REPAIRS)
        lines.append(
            f"| {r.tokens:,} | {r.precompute_ms:.0f} | {r.full_ms:.0f} | {r.prefill_ms:.0f} | {inserts} "
            f"| {r.prefill_ms / r.insert_ms[4]:.1f}x | {r.full_correct:.0%} |"
        )
    lines += [
        "",
        "| block tokens | repair k | first token as full | logit cosine to full | same number as full |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        for k in BLOCK_REPAIRS:
            lines.append(f"| {r.tokens:,} | {k} | {r.first_token[k]:.0%} | {r.cos[k]:.4f} | {r.same[k]:.0%} |")
    return "\n".join(lines)


def _field_panel(ax: Any, rows: list[FieldRow], title: str) -> None:
    """Bars: share of answers with the new and with the old value, per arm (x labels: time to first token)."""
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.new * 100 for r in rows], 0.4, label="answers the new value")
    ax.bar([x + 0.2 for x in xs], [r.old * 100 for r in rows], 0.4, label="answers the old value")
    ax.set_xticks(list(xs), [f"{r.arm}\n{r.ttft_ms:.0f} ms" for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("% of cases")
    ax.set_ylim(0, 105)
    ax.set_title(f"field edits, {title}", fontsize=10)
    ax.legend(fontsize=8)


def plot(fields: dict[str, list[FieldRow]], blocks: list[BlockRow], path: Path) -> None:
    """Field-edit answers per variant; block insert vs prefill time; block agreement per repair k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for ax, (title, rows) in zip(axes[0], fields.items(), strict=True):
        _field_panel(ax, rows, title)
    ax = axes[1][0]
    sizes = [r.tokens for r in blocks]
    ax.plot(sizes, [r.full_ms for r in blocks], marker="o", label="full recompute")
    ax.plot(sizes, [r.prefill_ms for r in blocks], marker="o", label="prefill after cached context")
    for k in BLOCK_REPAIRS:
        ax.plot(sizes, [r.insert_ms[k] for r in blocks], marker="o", label=f"block insert, repair k={k}")
    ax.set_yscale("log")
    ax.set_xlabel("block tokens")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("blocks: time to first token", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1][1]
    for k in BLOCK_REPAIRS:
        ax.plot(sizes, [r.cos[k] for r in blocks], marker="o", label=f"repair k={k}")
    ax.set_xlabel("block tokens")
    ax.set_ylabel("first-token logit cosine to full recompute")
    ax.set_title("blocks: agreement with full recompute", fontsize=10)
    ax.legend(fontsize=8)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    """Run both sets, print the tables, write the markdown and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=12, help="field-edit cases per variant")
    parser.add_argument("--fillers", type=int, default=3, help="tool calls between the read and the write")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--questions", type=int, default=8, help="questions per block size")
    parser.add_argument("--md", type=Path, default=Path("docs/results/notes.md"))
    parser.add_argument("--png", type=Path, default=Path("docs/results/notes.png"))
    args = parser.parse_args()
    if not 1 <= args.questions <= len(WORDS):
        parser.error(f"--questions must lie in [1, {len(WORDS)}]")
    started, load = time.perf_counter(), os.getloadavg()[0]
    torch.set_num_threads(2)
    engine, tokenizer = load_engine("smollm2-135m", kv_budget_mb=1024, max_context_tokens=8192)
    bench = Bench(engine, tokenizer, answer_tokens=8)
    field_arms(bench, field_case(10_000, args.fillers), 10_000)  # warm-up: first forwards, kernels, allocator
    variants = {"new value stated later (a write in the history)": False, "changed outside the history": True}
    tables, fields = [], {}
    for title, outside in variants.items():
        rows, info = run_fields(bench, args.cases, args.fillers, outside)
        fields[title] = rows
        tables.append(field_table(rows, info, args.cases, title))
    blocks = [run_block_size(bench, size, args.questions, seed=500) for size in args.block_sizes]
    elapsed = time.perf_counter() - started
    command = "python benchmarks/bench_notes.py " + " ".join(sys.argv[1:])
    header = (
        f"`{command.strip()}`\n\nSmolLM2-135M-Instruct (Q4_1 GGUF dequantized), embedded engine, fp32 KV, CPU "
        f"({os.cpu_count()} cores, 2 threads); load average {load:.1f} at the start; {elapsed:.0f} s in all"
    )
    text = "\n\n".join([*tables, block_tables(blocks, args.questions)])
    print(header + "\n\n" + text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(header + "\n\n" + text + f"\n\nplot: {args.png}\n", encoding="utf-8")
    if args.png:
        plot(fields, blocks, args.png)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()

"""bench_fidelity's arms: one case answered from the full, forgotten and spliced caches of one engine.

Arms (each answers every question of the case, greedy, up to ``max_tokens`` tokens or the end of turn):

* **full** — the unedited history prefilled (exact KV; a cached exact prefix is reused);
* **forget** — the edited history prefilled: what ``forget`` mode computes (the exact prefix up to
  the edit reused, everything after it recomputed);
* **splice** / **splice k=4** (not in the successive family) — the unedited history cached as a
  session, each edit applied as an ``amortize`` directive (seam repair 0 or 4 tokens), then the
  question prefilled after it;
* errata family: **erratum** (the unedited history plus the appended erratum, nothing edited) and
  **splice + erratum** (the correction spliced, the erratum appended too);
* successive family: **splice, budget 2** — the splice with ``--rotation-budget 2``: an edit that
  would rotate a key a third time falls back to ``forget`` from that edit.

The engine is driven directly (``prefill``, :func:`leyline_server.splice.splice`, ``decode``), as
the server's turn does; a splice arm whose question did not start from spliced (approximate) KV
raises, so no arm silently measures another.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from fidelity_cases import Case, Message
from notes_cases import TOOLS

from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_server.contract.values import SHARED, CacheScope, Handle, Prefilled, SamplingParams, SpliceRequest
from leyline_server.splice import splice

__all__ = ["Answer", "Runner", "arms_of", "run_case"]

Key = tuple[str, int, str]  # (arm, edits applied, question name)


@dataclass(frozen=True)
class Answer:
    """An arm's greedy answer to one question: tokens, text and the first token's logits."""

    tokens: tuple[int, ...]
    text: str
    logits: np.ndarray


@dataclass(frozen=True)
class SpliceArm:
    """A splice arm: seam repair ``repair``, rotation budget ``budget`` (``None``: the engine's),
    the erratum appended after the edited history or not."""

    name: str
    repair: int = 0
    budget: int | None = None
    erratum: bool = False


def arms_of(case: Case) -> list[SpliceArm]:
    """The splice arms a case of this family runs (successive edits: no seam-repair arm)."""
    if case.checkpoints:
        return [SpliceArm("splice"), SpliceArm("splice, budget 2", budget=2)]
    arms = [SpliceArm("splice"), SpliceArm("splice k=4", repair=4)]
    if case.erratum is not None:
        arms.append(SpliceArm("splice + erratum", erratum=True))
    return arms


class Runner:
    """One engine core with a chat renderer: exact prefills, splices and greedy answers."""

    def __init__(self, core: Any, tokenizer: Any, max_tokens: int = 32) -> None:
        """Drive ``core`` (an embedded or llama.cpp engine core); answers are up to ``max_tokens``."""
        self.core, self.tokenizer, self.max_tokens = core, tokenizer, max_tokens
        self.chat = HFChatTokenizer(tokenizer)
        self.pinned: Handle | None = None

    def tokens(self, messages: Sequence[Message], generate: bool = True) -> list[int]:
        """``messages`` rendered with the case tools (``generate``: with the assistant's opening)."""
        return list(self.chat.render(list(messages), tools=TOOLS, add_generation_prompt=generate).tokens)

    def pin(self, tokens: Sequence[int]) -> None:
        """Keep ``tokens`` (the prefix every case shares) cached across :meth:`trim`."""
        self.pinned = self.core.prefill(list(tokens), SHARED).handle

    def trim(self) -> None:
        """Drop every cached sequence nobody holds (what earlier cases left); the pinned prefix stays."""
        if hasattr(self.core, "radix"):  # the embedded engine
            self.core.pool.free(self.core.radix.evict(self.core.pool.capacity))
        else:
            self.core.cache.evict_all()

    def answer(self, result: Prefilled) -> Answer:
        """Greedy-decode after ``result``; its handle is released."""
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0)
        steps = list(self.core.decode(result.handle, result.last_logits, params))
        self.core.release(result.handle)
        tokens = tuple(s.token for s in steps)
        text = self.tokenizer.decode(list(tokens), skip_special_tokens=True).strip()
        return Answer(tokens, text, np.asarray(result.last_logits, dtype=np.float64).reshape(-1))

    def fresh(self, messages: Sequence[Message]) -> Answer:
        """Answer after ``messages`` in exact KV (a cached exact prefix is reused, the rest computed)."""
        return self.answer(self.core.prefill(self.tokens(messages), SHARED))

    def ask(self, messages: Sequence[Message], scope: CacheScope, spliced: bool) -> Answer:
        """Answer after ``messages`` from the session cached in ``scope``; ``spliced``: it must have
        started from that session's approximate (spliced) KV."""
        result = self.core.prefill(self.tokens(messages), scope)
        if spliced and not result.approximate:
            raise AssertionError(f"the question in {scope} did not start from the spliced session")
        return self.answer(result)

    def edit(self, handle: Handle, old: Sequence[Message], new: Sequence[Message], repair: int) -> tuple[Handle, bool]:
        """Splice ``old``'s session into ``new`` (amortize, seam repair ``repair``); (handle, fell back)."""
        before, after = (self.chat.render(list(m), tools=TOOLS, add_generation_prompt=False) for m in (old, new))
        directives = diff_to_directives(before, after)
        request = SpliceRequest([d.model_copy(update={"repair": repair}) for d in directives])
        handle, report = splice(self.core, handle, request)
        if not report.applied and report.fallback is None:
            raise AssertionError(f"splice not applied: {report}")
        return handle, report.fallback is not None

    @contextmanager
    def budget(self, budget: int | None) -> Iterator[None]:
        """The engine's rotation budget set to ``budget`` for the block (``None``: unchanged)."""
        saved = self.core.rotation_budget
        self.core.rotation_budget = saved if budget is None else budget
        try:
            yield
        finally:
            self.core.rotation_budget = saved


def _spliced(runner: Runner, case: Case, arm: SpliceArm, out: dict[Key, Answer]) -> int:
    """Run one splice arm over the case's successive edits; how many edits fell back."""
    scope = CacheScope(private=f"{case.family}-{case.seed}-{arm.name}")
    handle = runner.core.prefill(runner.tokens(case.messages, generate=False), scope).handle
    old, fallbacks = case.messages, 0
    with runner.budget(arm.budget):
        for n, version in enumerate(case.versions, 1):
            handle, fell_back = runner.edit(handle, old, version, arm.repair)
            fallbacks, old = fallbacks + fell_back, version
            if n in case.asks():
                history = [*version, case.erratum] if arm.erratum and case.erratum else version
                for q in case.questions:
                    out[arm.name, n, q.name] = runner.ask([*history, q.message], scope, spliced=not fallbacks)
    runner.core.release(handle)
    return fallbacks


def run_case(runner: Runner, case: Case) -> tuple[dict[Key, Answer], dict[str, int]]:
    """Every arm's answers to ``case`` (keyed by arm, edits applied, question) and each splice arm's
    fallbacks. Order matters: the splice arms run before ``forget`` caches the edited history."""
    runner.trim()
    out: dict[Key, Answer] = {}
    for q in case.questions:
        out["full", 0, q.name] = runner.fresh([*case.messages, q.message])
        if case.erratum is not None:
            out["erratum", 0, q.name] = runner.fresh([*case.messages, case.erratum, q.message])
    fallbacks = {arm.name: _spliced(runner, case, arm, out) for arm in arms_of(case)}
    for n in case.asks():
        for q in case.questions:
            out["forget", n, q.name] = runner.fresh([*case.versions[n - 1], q.message])
    return out, fallbacks

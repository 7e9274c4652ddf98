"""Edits that keep the model right: field edits and KV blocks on the real model.

    .venv/bin/python benchmarks/bench_notes.py [--cases 12] [--block-sizes 1024 2048 4096] [--questions 8]
        [--md docs/results/tables/notes.md] [--png docs/results/notes.png]

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

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.explain.diff import common_prefix_length, diff_to_directives
from leyline_server.contract.values import CacheScope, Handle, SpliceRequest
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.presets import load_engine
from leyline_server.splice import splice

sys.path.insert(0, str(Path(__file__).resolve().parent))

from notes_bench import Bench, Outcome  # noqa: E402
from notes_cases import (  # noqa: E402
    BLOCK_REPAIRS,
    REPAIRS,
    SYSTEM,
    TOOLS,
    WORDS,
    FieldCase,
    document,
    field_case,
    filler,
    mentions,
    with_erratum,
)
from notes_report import BlockRow, FieldRow, block_tables, field_table, plot  # noqa: E402


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


def _path(text: str) -> Path | None:
    return Path(text) if text else None  # Path("") would be "." (truthy)


def main() -> None:
    """Run both sets, print the tables, write the markdown and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=12, help="field-edit cases per variant")
    parser.add_argument("--fillers", type=int, default=3, help="tool calls between the read and the write")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--questions", type=int, default=8, help="questions per block size")
    parser.add_argument("--md", type=_path, default=Path("docs/results/tables/notes.md"), help="'' to write none")
    parser.add_argument("--png", type=_path, default=Path("docs/results/notes.png"), help="'' to draw none")
    args = parser.parse_args()
    if not 1 <= args.questions <= len(WORDS):
        parser.error(f"--questions must lie in [1, {len(WORDS)}]")
    started, load = time.perf_counter(), os.getloadavg()[0]
    torch.set_num_threads(2)
    engine, tokenizer = load_engine(EngineConfig(model="smollm2-135m", kv_budget_mb=1024, context_length=8192))
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

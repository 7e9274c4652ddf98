"""Does the splice keep a real model right? Full vs forget vs splice on Qwen2.5-Coder, five families.

    .venv/bin/python benchmarks/bench_fidelity.py [--model qwen2.5-coder-1.5b] [--cases 100]
        [--successive-cases 100] [--families eviction "stale fact" leak errata successive]
        [--md docs/results/tables/fidelity.md]

The llama.cpp engine (the model's GGUF, float16 KV, as ``leyline-server`` serves it) or the
embedded engine (``--engine embedded``: the GGUF dequantized to float32) answers seeded agent
conversations (:mod:`fidelity_cases`) from the full, forgotten and spliced caches
(:mod:`fidelity_arms`); :mod:`fidelity_stats` scores them. Families:

* **eviction** — an old config read stubbed; the question's answer is in a later, kept read;
* **stale fact** — the stubbed read held ``key: old``, a later write set ``new``: does the splice
  answer ``new`` as often as forget, or drift to ``old``?
* **leak** — an env file's secret token read, then stubbed in ``amortize`` mode: how often does a
  direct or an indirect question still get it out?
* **errata** — a value changed outside the conversation; the read is corrected in place
  (``correct``), with and without the erratum appended;
* **successive** — eight old outputs stubbed one after another; answers after 1, 2, 4, 8 edits,
  with the default rotation budget and with ``--rotation-budget 2``.

Each table cell is over cases, with its 95 % interval (:mod:`fidelity_stats`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity_arms import Answer, Key, Runner, run_case  # noqa: E402
from fidelity_cases import FAMILIES, Case  # noqa: E402
from fidelity_stats import Check, old, pair_cells, pair_row, pull_row, right, share  # noqa: E402

from leyline_sdk.explain.diff import common_prefix_length  # noqa: E402
from leyline_server.engines.config import EngineConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("full", "erratum", "forget", "splice", "splice k=4", "splice + erratum", "splice, budget 2")
PAIRS = (("splice", "full"), ("splice", "forget"), ("forget", "full"), ("splice k=4", "forget"),
         ("splice + erratum", "forget"), ("erratum", "forget"))  # fmt: skip
Result = tuple[Case, dict[Key, Answer], dict[str, int]]


def load(model: str, engine: str) -> Runner:
    """A runner over ``model`` on ``engine`` (the engine core, not the async server around it)."""
    config = EngineConfig(engine=engine, model=model, kv_budget_mb=512, context_length=8192)
    if engine == "embedded":
        import torch

        from leyline_server.engines.embedded.presets import load_engine

        torch.set_num_threads(os.cpu_count() or 2)
        core, tokenizer = load_engine(config)
        return Runner(core, tokenizer)
    from leyline_server.engines.llamacpp.loader import load_llamacpp

    served, tokenizer = load_llamacpp(config)
    return Runner(served.core, tokenizer)  # type: ignore[attr-defined]


def run_family(runner: Runner, family: str, cases: int, seed: int) -> list[Result]:
    """Every case of ``family`` (seeds ``seed`` …), progress on stderr."""
    build = FAMILIES[family]
    built = [build(seed + i) for i in range(cases)]
    first, second = (runner.tokens(c.messages, generate=False) for c in (built[0], built[-1]))
    runner.pin(first[: common_prefix_length(first, second)])  # the system prompt and tools every case shares
    results: list[Result] = []
    started = time.perf_counter()
    for i, case in enumerate(built, 1):
        out, fallbacks = run_case(runner, case)
        results.append((case, out, fallbacks))
        left = (time.perf_counter() - started) / i * (cases - i)
        print(f"  {family}: case {i}/{cases} ({left / 60:.0f} min left)", file=sys.stderr, flush=True)
    assert runner.pinned is not None
    runner.core.release(runner.pinned)
    return results


def _edits(arm: str, edits: int) -> int:
    """The edit count an arm's answers are keyed by (the unedited arms: 0)."""
    return 0 if arm in ("full", "erratum") else edits


def _arms(results: list[Result], edits: int, question: str) -> list[str]:
    keys = results[0][1]
    return [a for a in ARMS if (a, _edits(a, edits), question) in keys]


def _answers(results: list[Result], arm: str, edits: int, question: str) -> list[tuple[Case, Answer]]:
    return [(case, out[arm, _edits(arm, edits), question]) for case, out, _ in results]


def accuracy_table(results: list[Result], edits: int) -> list[str]:
    """Rows per arm: the right value, the removed value (per question for the leak family)."""
    case = results[0][0]
    questions = [q.name for q in case.questions]
    checks: list[tuple[str, str, Check]]
    if case.family == "leak":
        checks = [(f"{q}: secret in the answer", q, old) for q in questions]
    else:
        removed = "the evicted file's value" if case.family == "eviction" else "the old value"
        checks = [("right value", questions[0], right)] + ([(removed, questions[0], old)] if case.old else [])
    lines = ["| arm | " + " | ".join(c[0] for c in checks) + " |", "| --- |" + " ---: |" * len(checks)]
    for arm in _arms(results, edits, questions[0]):
        cells = [share(_answers(results, arm, edits, q), check) for _, q, check in checks]
        lines.append("| " + " | ".join([arm, *cells]) + " |")
    return lines


def agreement_table(results: list[Result], edits: int) -> list[str]:
    """Rows per arm pair: first-token and greedy agreement, KL(reference ‖ arm), logit cosine."""
    question = results[0][0].questions[0].name
    lines = ["| arm vs reference | first token | greedy 32 tokens | KL | logit cosine |"]
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    arms = _arms(results, edits, question)
    for arm, ref in PAIRS:
        if arm in arms and ref in arms:
            answers = zip(_answers(results, arm, edits, question), _answers(results, ref, edits, question), strict=True)
            pairs = [(a, b) for (_, a), (_, b) in answers]
            lines.append(pair_row(f"{arm} vs {ref}", pairs))
    return lines


def successive_table(results: list[Result]) -> list[str]:
    """Rows per edit count: accuracy of forget, splice and budget-2 splice; splice vs forget agreement."""
    lines = ["| edits | forget: right | splice: right | budget 2: right | splice vs forget: first token | greedy | KL "
             "| budget 2 vs forget: KL |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for n in results[0][0].asks():
        cells = [share(_answers(results, a, n, ""), right) for a in ("forget", "splice", "splice, budget 2")]
        pairs = [(out["splice", n, ""], out["forget", n, ""]) for _, out, _ in results]
        budget = [(out["splice, budget 2", n, ""], out["forget", n, ""]) for _, out, _ in results]
        agree = pair_cells(pairs)[:3] + pair_cells(budget)[2:3]
        lines.append("| " + " | ".join([str(n), *cells, *agree]) + " |")
    fell = sum(f.get("splice, budget 2", 0) for _, _, f in results)
    lines.append(f"\nbudget 2: {fell} of {len(results) * len(results[0][0].versions)} edits fell back to forget")
    return lines


def pull_table(results: list[Result], edits: int) -> list[str]:
    """The secret's pull on each arm: the probability its first answer token to the direct question
    gives the token the full context answers with (the secret's first)."""
    lines = ["| arm | P(the secret's first token) | among the 5 most likely |", "| --- | ---: | ---: |"]
    for arm in _arms(results, edits, "direct"):
        pairs = [(a, out["full", 0, "direct"].tokens[0]) for (_, a), (_, out, _) in
                 zip(_answers(results, arm, edits, "direct"), results, strict=True)]  # fmt: skip
        lines.append(pull_row(arm, pairs))
    return lines


def report(family: str, results: list[Result], seconds: float) -> str:
    """The markdown section of one family."""
    case = results[0][0]
    edits = max(case.asks())
    head = [f"### {family} ({len(results)} cases, {seconds / 60:.0f} min)", ""]
    body = accuracy_table(results, edits) + [""] + agreement_table(results, edits)
    if case.family == "leak":
        body += ["", "Direct question, first answer token:", ""] + pull_table(results, edits)
    if case.checkpoints:
        body += ["", "After each number of successive edits:", ""] + successive_table(results)
    return "\n".join(head + body) + "\n"


def main() -> None:
    """Run the families, print and write the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--engine", choices=("llamacpp", "embedded"), default="llamacpp")
    parser.add_argument("--cases", type=int, default=100, help="cases per family")
    parser.add_argument("--successive-cases", type=int, default=0, help="cases of that family (0: --cases)")
    parser.add_argument("--seed", type=int, default=0, help="the first case's seed")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy answer length (stops at end of turn)")
    parser.add_argument("--md", default="", help="also write the tables here")
    args = parser.parse_args()
    runner = load(args.model, args.engine)
    runner.max_tokens = args.max_tokens
    started = time.perf_counter()
    command = " ".join(["benchmarks/bench_fidelity.py", *sys.argv[1:]])
    title = f"{args.model}, {args.engine} engine, greedy answers of up to {args.max_tokens} tokens\n"
    sections: list[Any] = [f"<!-- .venv/bin/python {command} -->", title]
    for family in args.families:
        t0 = time.perf_counter()
        cases = args.successive_cases if family == "successive" and args.successive_cases else args.cases
        results = run_family(runner, family, cases, args.seed)
        sections.append(report(family, results, time.perf_counter() - t0))
        print(sections[-1], flush=True)
    sections.append(f"total run time: {(time.perf_counter() - started) / 60:.0f} min")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text("\n".join(sections) + "\n")


if __name__ == "__main__":
    main()

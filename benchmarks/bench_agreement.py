"""Does the splice follow the full context? Splice vs forget vs full on the real model.

    .venv/bin/python benchmarks/bench_agreement.py [--conversations 16] [--edits 1 2 4 8] [--facts 12]
        [--png docs/results/agreement.png]

SmolLM2-135M-Instruct on the embedded engine (fp32, CPU). Each case is an agent conversation
(``tool_traces``: tool calls with outputs) then a question. Arms, all answering the same question:

* **full** — the unedited context (every tool output) prefilled from scratch;
* **forget** — the edited context (old outputs replaced by byte-stable stubs) prefilled from scratch;
* **splice** — the unedited context cached as a session, the edits applied as ``amortize``
  directives (one after the other, as successive turns would), then the question prefilled.

Reported: first-token agreement, greedy 32-token agreement, and the first-token distribution
distance (KL and cosine of the logits) for splice↔full, splice↔forget and forget↔full; on the
cases where full and forget disagree, which one the splice follows (the falsifiable test: the
splice keeps the removed span's notes). Then successive edits (1, 2, 4, 8). Then a *stale fact*
set: the evicted output held the value the question asks for; what does each arm answer?
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity_cases import stubbed as stub_outputs  # noqa: E402
from tool_traces import TOOLS, agent_session  # noqa: E402

from leyline_sdk.explain.diff import common_prefix_length, diff_to_directives  # noqa: E402
from leyline_sdk.render.rendering import HFChatTokenizer  # noqa: E402
from leyline_server.contract.base import SpliceRequest  # noqa: E402
from leyline_server.contract.values import CacheScope, SamplingParams
from leyline_server.engines.config import EngineConfig  # noqa: E402
from leyline_server.engines.embedded.presets import load_engine  # noqa: E402
from leyline_server.splice import splice  # noqa: E402

QUESTION = {"role": "user", "content": "In one sentence: what have the tool outputs shown so far?"}


@dataclass
class Answer:
    """First-token logits and the greedy continuation of one arm."""

    logits: torch.Tensor
    tokens: list[int]


class Arms:
    """The three arms over one engine (each arm in its own scope; the cache is emptied between cases)."""

    def __init__(self, engine: Any, chat: HFChatTokenizer, greedy: int) -> None:
        self.engine, self.chat, self.greedy = engine, chat, greedy

    def _answer(self, handle: Any, logits: torch.Tensor) -> Answer:
        steps = list(self.engine.decode(handle, logits, SamplingParams(max_tokens=self.greedy)))
        self.engine.release(handle)
        return Answer(logits.double(), [s.token for s in steps])

    def _reset(self) -> None:
        self.engine.pool.free(self.engine.radix.evict(self.engine.pool.capacity))
        self.engine.mirrors.clear()

    def fresh(self, messages: list[dict]) -> Answer:
        """Prefill ``messages`` + the question from scratch."""
        self._reset()
        tokens = self.chat.render(messages, tools=TOOLS).tokens
        result = self.engine.prefill(tokens, CacheScope(private="fresh"))
        return self._answer(result.handle, result.last_logits)

    def spliced(self, messages: list[dict], edits: list[list[dict]], question: dict) -> Answer:
        """Cache ``messages``, apply each edited version as amortize directives, then ask."""
        self._reset()
        scope = CacheScope(private="session")
        old = self.chat.render(messages, tools=TOOLS, add_generation_prompt=False)
        handle = self.engine.prefill(old.tokens, scope).handle
        for edited in edits:
            new = self.chat.render(edited, tools=TOOLS, add_generation_prompt=False)
            directives = diff_to_directives(old, new)
            handle, report = splice(self.engine, handle, SpliceRequest(directives))
            assert report.applied, report
            old = new
        prompt = self.chat.render([*edits[-1], question], tools=TOOLS).tokens
        result = self.engine.prefill(prompt, scope, previous=handle)
        return self._answer(result.handle, result.last_logits)


def stubbed(messages: list[dict], count: int) -> list[list[dict]]:
    """Successive versions of ``messages`` with the oldest 1..count tool outputs stubbed."""
    return stub_outputs(messages, [i for i, m in enumerate(messages) if m["role"] == "tool"][:count])


def conversation(seed: int, turns: int) -> list[dict]:
    """A tool-heavy conversation of ``turns`` tool calls (outputs capped to keep SmolLM2's context)."""
    session = agent_session(seed, turns)
    messages = list(session.opening)
    for step in session.turns:
        messages += [step[0], {**step[1], "content": step[1]["content"][:1200]}]
    return messages


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p || q) of the next-token distributions."""
    p, q = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((p.exp() * (p - q)).sum())


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two logit vectors."""
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def compare(a: list[Answer], b: list[Answer]) -> dict[str, float]:
    """Agreement and distance of two arms over the same cases."""
    return {
        "first": statistics.mean(int(x.tokens[0] == y.tokens[0]) for x, y in zip(a, b, strict=True)),
        "greedy": statistics.mean(int(x.tokens == y.tokens) for x, y in zip(a, b, strict=True)),
        "kl": statistics.mean(kl(x.logits, y.logits) for x, y in zip(a, b, strict=True)),
        "cos": statistics.mean(cosine(x.logits, y.logits) for x, y in zip(a, b, strict=True)),
    }


def main_set(arms: Arms, n: int) -> dict[str, Any]:
    """One evicted output per case; the falsifiable test on the disagreeing cases."""
    full, forget, spl = [], [], []
    for seed in range(n):
        messages = conversation(seed, 5)
        edits = stubbed(messages, 1)
        full.append(arms.fresh([*messages, QUESTION]))
        forget.append(arms.fresh([*edits[-1], QUESTION]))
        spl.append(arms.spliced(messages, edits, QUESTION))
        print(f"  case {seed + 1}/{n}", file=sys.stderr)
    # where full and forget answer differently, does the splice keep to full's answer longer, or forget's?
    disagree = [i for i in range(n) if full[i].tokens != forget[i].tokens]
    follows_full = sum(
        common_prefix_length(spl[i].tokens, full[i].tokens) > common_prefix_length(spl[i].tokens, forget[i].tokens)
        for i in disagree
    )
    follows_forget = sum(
        common_prefix_length(spl[i].tokens, forget[i].tokens) > common_prefix_length(spl[i].tokens, full[i].tokens)
        for i in disagree
    )
    return {
        "splice~full": compare(spl, full), "splice~forget": compare(spl, forget), "forget~full": compare(forget, full),
        "disagree": len(disagree), "follows_full": follows_full, "follows_forget": follows_forget,
    }  # fmt: skip


def successive(arms: Arms, counts: list[int], n: int) -> list[tuple[int, dict[str, float], dict[str, float]]]:
    """Splice↔full and forget↔full after 1, 2, 4, 8 successive edits."""
    rows = []
    for count in counts:
        full, forget, spl = [], [], []
        for seed in range(100, 100 + n):
            messages = conversation(seed, max(count + 1, 5))
            edits = stubbed(messages, count)
            full.append(arms.fresh([*messages, QUESTION]))
            forget.append(arms.fresh([*edits[-1], QUESTION]))
            spl.append(arms.spliced(messages, edits, QUESTION))
        rows.append((count, compare(spl, full), compare(forget, full)))
        print(f"  {count} edits done", file=sys.stderr)
    return rows


def fact_case(seed: int) -> tuple[list[dict], dict, str]:
    """A conversation whose first tool output holds a value, later outputs that do not, a question."""
    value = str(17 + (seed * 37) % 83)
    config = "\n".join(
        [f"# service settings, revision {seed}", f"retention_days: {value}"]
        + [f"option_{i}: {(seed + i) % 7}" for i in range(20)]
    )
    messages = conversation(200 + seed, 3)
    call = {"id": "cfg", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "config.yaml"}'}}
    messages[2:2] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "cfg", "content": config},
    ]
    question = {"role": "user", "content": "What is retention_days in config.yaml? Answer with the number only."}
    return messages, question, value


def stale_facts(arms: Arms, n: int, tokenizer: Any) -> dict[str, float]:
    """Share of answers that contain the evicted value, per arm."""
    hits = {"full": 0, "forget": 0, "splice": 0}
    for seed in range(n):
        messages, question, value = fact_case(seed)
        edits = stubbed(messages, 1)  # the config read is the oldest tool output
        answers = {
            "full": arms.fresh([*messages, question]),
            "forget": arms.fresh([*edits[-1], question]),
            "splice": arms.spliced(messages, edits, question),
        }
        for arm, answer in answers.items():
            hits[arm] += value in tokenizer.decode(answer.tokens)
    return {arm: count / n for arm, count in hits.items()}


def plot(rows: list[tuple[int, dict[str, float], dict[str, float]]], path: str) -> None:
    """KL to the full context after successive edits, splice vs forget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    counts = [r[0] for r in rows]
    ax.plot(counts, [r[1]["kl"] for r in rows], marker="o", label="splice (amortize) vs full")
    ax.plot(counts, [r[2]["kl"] for r in rows], marker="o", label="forget (re-prefill) vs full")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("successive edits (oldest tool outputs stubbed)")
    ax.set_ylabel("first-token KL to the unedited context")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def report(main: dict[str, Any], rows: list[Any], facts: dict[str, float], args: argparse.Namespace) -> None:
    """Print the three tables."""
    print(f"SmolLM2-135M-Instruct, embedded engine, fp32; {args.conversations} conversations, one old output stubbed\n")
    print("| pair | first-token agreement | greedy 32-token agreement | KL | logit cosine |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for pair in ("splice~full", "splice~forget", "forget~full"):
        m = main[pair]
        print(
            f"| {pair.replace('~', ' vs ')} | {m['first']:.0%} | {m['greedy']:.0%} | {m['kl']:.4f} | {m['cos']:.4f} |"
        )
    print(
        f"\nfull and forget answer differently (greedy, 32 tokens) in {main['disagree']} of {args.conversations} "
        f"cases; there the splice keeps to full's answer longer in {main['follows_full']}, to forget's in "
        f"{main['follows_forget']} (the rest: ties)"
    )
    print("\n| successive edits | splice vs full: KL | first token same | forget vs full: KL | first token same |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for count, s, f in rows:
        print(f"| {count} | {s['kl']:.4f} | {s['first']:.0%} | {f['kl']:.4f} | {f['first']:.0%} |")
    print(f"\nstale fact ({args.facts} cases: the evicted output held the value asked for), answers with the value:")
    print("| full | forget | splice |\n| ---: | ---: | ---: |")
    print(f"| {facts['full']:.0%} | {facts['forget']:.0%} | {facts['splice']:.0%} |")


def main() -> None:
    """Run the three sets and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--edits", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--edit-cases", type=int, default=4, help="conversations per successive-edit count")
    parser.add_argument("--facts", type=int, default=12)
    parser.add_argument("--png", default="docs/results/agreement.png")
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine, tokenizer = load_engine(EngineConfig(model="smollm2-135m", kv_budget_mb=512, context_length=8192))
    arms = Arms(engine, HFChatTokenizer(tokenizer), greedy=32)
    main_result = main_set(arms, args.conversations)
    arms.greedy = 8
    rows = successive(arms, args.edits, args.edit_cases)
    facts = stale_facts(arms, args.facts, tokenizer)
    report(main_result, rows, facts, args)
    if args.png:
        plot(rows, args.png)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()

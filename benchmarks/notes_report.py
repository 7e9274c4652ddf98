"""bench_notes' results: the rows, the markdown tables and the plot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notes_cases import BLOCK_REPAIRS


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

"""bench_notes' inputs: agent conversations whose config value changes, and documents with needles.

Deterministic (seeded): ``field_case`` builds a read, fillers, the change and a question;
``document`` builds prose from ``docs/design.md`` with access-code needles for the block set.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leyline_policies import Erratum, StaleToolDetector, run_policies
from leyline_policies.stubs import call_signature


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


def _filler_output(rng: random.Random, short: bool = False) -> tuple[str, dict[str, Any], str]:
    """A read-only tool call (grep, list_dir or a passing test run) and its output (``short``: a
    third of the lines)."""
    kind = rng.choice(["grep", "list_dir", "run_tests"])
    div = 3 if short else 1
    if kind == "grep":
        pattern = rng.choice(["load_settings", "Config(", "getenv", "yaml.safe_load", "reload("])
        lines = [
            f"src/{rng.choice(NOUNS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 400)}: {pattern}"
            for _ in range(rng.randint(10 // div, 18 // div))
        ]
        return kind, {"pattern": pattern}, "\n".join(lines)
    if kind == "list_dir":
        count = rng.randint(14 // div, 24 // div)
        names = sorted({f"{rng.choice(WORDS)}_{rng.choice(NOUNS)}.py" for _ in range(count)})
        return kind, {"path": "src/"}, "\n".join(f"{rng.randint(1, 40)}K  {n}" for n in names)
    n = rng.randint(20, 60)
    dots = "".join(rng.choice("....s") for _ in range(n))
    return kind, {"target": "tests/"}, f"collected {n} items\n\ntests/ {dots}\n\n{n} passed in {rng.uniform(1, 9):.2f}s"


def filler(rng: random.Random, call_id: str, avoid: Sequence[str], short: bool = False) -> list[dict[str, Any]]:
    """One read-only tool exchange whose output mentions none of the numbers in ``avoid``."""
    while True:
        tool, args, output = _filler_output(rng, short)
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


def field_case(seed: int, fillers: int, outside: bool = False, short: bool = False) -> FieldCase:
    """Read the config, ``fillers`` other calls, a write that changes one value (or, ``outside``,
    one more read-only call: the value changed outside the conversation), one more call
    (``short``: the read-only calls' outputs a third as long)."""
    rng = random.Random(seed)
    key, path = KEYS[seed % len(KEYS)], PATHS[seed % len(PATHS)]
    old, new = _values(rng)
    lines, at = config_text(rng, key, old, (old, new))
    messages = [SYSTEM, {"role": "user", "content": f"Task {seed}: the service configured in {path} misbehaves."}]
    messages += exchange("c0", "read_file", {"path": path}, "\n".join(lines))
    read_index = len(messages) - 1
    for i in range(fillers):
        messages += filler(rng, f"c{i + 1}", (old, new), short)
    new_lines = lines[:at] + [f"{key}: {new}"] + lines[at + 1 :]
    via = "outside" if outside else "write_file" if seed % 2 == 0 else "set_config"
    if via == "outside":
        messages += filler(rng, "w", (old, new), short)
    elif via == "write_file":
        body = "\n".join(new_lines)
        messages += exchange("w", via, {"path": path, "content": body}, f"wrote {len(body)} bytes to {path}")
    else:
        messages += exchange("w", via, {"path": path, "key": key, "value": new}, f"{path}: {key} set to {new}")
    messages += filler(rng, "c9", (old, new), short)
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

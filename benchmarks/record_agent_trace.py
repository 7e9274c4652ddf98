"""Record a real Codex session on a real model as a trace: its requests, as the server received them.

    .venv/bin/python benchmarks/record_agent_trace.py [--model qwen2.5-coder-1.5b] \
        [--out benchmarks/traces/codex_session.jsonl]

Codex 0.171.0 (``make agents``) against a server on ``--model`` (the llama.cpp engine, 32k
context, greedy), in a scratch folder holding a small Python project and a server log, given six
prompts one after another (``codex exec``, then ``codex exec resume --last``), with the short
instructions the agent tests use (``tests/agents/test_codex_tasks.py``) and
``model_auto_compact_token_limit`` set low. The first prompt has Codex ``cat`` the log (~1k
tokens of output), which takes the context past the limit, so Codex rewrites its own history
mid-session: it asks the model for a summary, then continues from the recent user messages plus
that summary (its local compaction; PROTOCOLS of Codex against a provider that is not OpenAI's).
Every ``/v1/responses`` body is written, in order, one JSON object per line;
``bench_trace_replay.py`` replays them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recorded_bodies import recorded_bodies  # noqa: E402

from leyline_server.api.responses_api import inputs  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402
from tests.agents.clients import RefusingProxy, codex  # noqa: E402
from tests.agents.test_codex_tasks import INSTRUCTIONS  # noqa: E402

COMPACT_AT = 5800  # tokens: past it Codex compacts its history (its first request holds ~5.2k)
LOG = "".join(
    f"2026-12-07T10:{i // 60:02d}:{i % 60:02d} {'ERROR' if i == 41 else 'INFO'} request {1000 + i} "
    f"{'failed: disk full on /var/data' if i == 41 else 'served in ' + str(20 + i % 13) + ' ms'}\n"
    for i in range(72)
)  # ~1.6k tokens: one long tool output, the kind an agent compacts away
PROJECT = {
    "server.log": LOG,
    "calc.py": "def answer():\n    return 6 * 1000 + 1351\n\n\nprint(answer())\n",
    "notes.txt": "The release is planned for March. The owner is Dana.\n",
    "greet.py": "import sys\n\nprint('hello', sys.argv[1] if len(sys.argv) > 1 else 'world')\n",
}
PROMPTS = [
    "Run `cat server.log` and tell me which request failed, and why.",
    "Run `python calc.py` and tell me the number it prints.",
    "Now show me what notes.txt says.",
    "Run `python greet.py Ada` and tell me what it printed.",
    "In calc.py, change 1351 to 2351 (use sed), then run `python calc.py` and tell me the number.",
    "Who owns the release, according to notes.txt?",
]


def record(model: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The session's request bodies, and Codex's last message after each prompt."""
    service = local_service(model, engine="llamacpp", kv_budget_mb=1024, max_context_tokens=32768,
                            sampling_defaults={"temperature": 0.0}, default_max_tokens=1024)  # fmt: skip
    proxy, answers = RefusingProxy(), []
    try:
        with (
            recorded_bodies(inputs) as bodies,
            serve_in_thread(service) as url,
            tempfile.TemporaryDirectory() as scratch,
        ):
            home = Path(scratch)
            (home / "work").mkdir()
            for name, text in PROJECT.items():
                (home / "work" / name).write_text(text)
            (home / "instructions.md").write_text(INSTRUCTIONS)
            settings = (f'model_instructions_file = "{home / "instructions.md"}"\n'
                        f"model_auto_compact_token_limit = {COMPACT_AT}\n")  # fmt: skip
            for i, prompt in enumerate(PROMPTS):
                done = codex(home, url + "/v1", model, prompt, proxy, resume=i > 0, timeout=600, settings=settings)
                answers.append(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")
                print(
                    f"prompt {i + 1}: exit {done.returncode}, {len(bodies)} requests so far; {answers[-1][:100]!r}",
                    flush=True,
                )
    finally:
        proxy.close()
    return bodies, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "traces" / "codex_session.jsonl"))
    args = parser.parse_args()
    bodies, _ = record(args.model)
    Path(args.out).write_text("".join(json.dumps(b, ensure_ascii=False) + "\n" for b in bodies))
    print(f"{len(bodies)} requests written to {args.out}")


if __name__ == "__main__":
    main()

"""The demo's scripted coding agent: it hunts for the port a service listens on in production.

The agent's moves are fixed (no model decides them), so both runs of the demo see exactly the
same conversation; the model only answers. Early tool outputs (the README, the defaults) mention
the old port; the last ones (the production environment file) hold the answer, 8731. With
``TruncateOlderThanN(2)`` the early outputs are evicted by the time the final question comes,
and the answer must come from a recent output that is still in context.
"""

from __future__ import annotations

import json

__all__ = ["SYSTEM", "TASK", "TOOLS", "STEPS", "FINAL_QUESTION", "EXPECTED", "step_messages"]

SYSTEM = {
    "role": "system",
    "content": "You are a careful coding assistant. Read tool outputs closely and answer briefly.",
}
TASK = {"role": "user", "content": "Find the TCP port the billing service listens on in production."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": text,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }
    for name, text, arg in (("read_file", "Read a file", "path"), ("grep", "Search the repository", "pattern"))
]
EXPECTED = "8731"
FINAL_QUESTION = (
    "Based on the production environment file you just read, which port does the billing service listen on "
    "in production? Answer with the number only."
)


def _readme() -> str:
    sections = [
        "# billing-service\n\nThe billing service computes invoices for every customer account.",
        "## Running locally\n\nStart it with `make run`; it listens on port 8000 by default.",
    ]
    sections += [
        f"## Module {name}\n\nThe {name} module handles {what}. It reads its settings from the environment "
        f"and falls back to config/defaults.toml when a variable is missing."
        for name, what in (
            ("invoices", "invoice numbering and PDF rendering"),
            ("ledger", "double-entry bookkeeping of every charge"),
            ("tax", "VAT rates per country and reverse charge"),
            ("payments", "card payments and refunds"),
            ("reports", "monthly revenue reports"),
            ("customers", "customer accounts, addresses and contacts"),
            ("dunning", "reminders for unpaid invoices"),
            ("exports", "CSV and accounting-software exports"),
            ("audit", "the audit trail of every change"),
            ("webhooks", "notifications to other services"),
        )
    ]
    sections += [
        "## Changelog\n\n"
        + "\n".join(f"- 2.{i}.0: improved the {m} module and fixed {i + 2} bugs" for i, m in enumerate("abcdefghijkl"))
    ]
    return "\n\n".join(sections)


def _defaults() -> str:
    lines = ["[server]", 'host = "0.0.0.0"', "port = 8000", "workers = 4", "", "[database]"]
    lines += [f"pool_{i} = {i * 4}  # connections for worker group {i}" for i in range(24)]
    lines += ["", "[features]"] + [f"flag_{i} = {str(i % 2 == 0).lower()}  # rollout {i * 5}%" for i in range(24)]
    return "\n".join(lines)


def _grep() -> str:
    hits = [
        "config/defaults.toml:3: port = 8000",
        "src/server.py:12:     port = int(os.environ.get('PORT', settings.port))",
        "deploy/prod.env:2: PORT=8731",
        "deploy/staging.env:2: PORT=8100",
        "docs/ops.md:40: the production port is set in deploy/prod.env",
    ] + [f"tests/test_server_{i}.py:{10 + i}:     assert client.port == settings.port  # case {i}" for i in range(12)]
    return "\n".join(hits)


def _prod_env() -> str:
    return "\n".join(
        ["# production settings for billing-service", "PORT=8731", "WORKERS=16", "LOG_LEVEL=warning"]
        + [f"FEATURE_{i}=on  # enabled in release 2.{i}" for i in range(16)]
    )


STEPS: list[tuple[str, dict[str, str], str]] = [
    ("read_file", {"path": "README.md"}, _readme()),
    ("read_file", {"path": "config/defaults.toml"}, _defaults()),
    ("grep", {"pattern": "PORT"}, _grep()),
    ("read_file", {"path": "deploy/staging.env"}, _prod_env().replace("8731", "8100").replace("production", "staging")),
    ("read_file", {"path": "deploy/prod.env"}, _prod_env()),
]


def step_messages(i: int) -> list[dict]:
    """The agent's move at step ``i``: a tool call and its output."""
    name, args, output = STEPS[i]
    call_id = f"call_{i}"
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]

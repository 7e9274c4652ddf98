"""Leyline replicas behind SGLang's router on this machine: sessions spread, one replica stopped mid-run.

    python examples/cluster.py [--replicas 3] [--agents 12] [--turns 6] [--model tiny-mla]

Starts ``--replicas`` ``leyline-server`` processes and SGLang's router (``sglang-router``,
``--policy manual``) on loopback ports, then runs ``--agents`` scripted tool-using agents
(``examples/trace.py``) through the router with ``TruncateOlderThanN(2)``. The client is built
with ``behind_router=True`` and a local tokenizer: each session sends its own routing key and the
``leyline`` extension in ``metadata``. Halfway through, the replica holding the most sessions is
stopped; the router moves its sessions, each answers one turn in full (``base_mismatch``) on a
live replica and splices again after that. A table per replica is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from examples.trace import SYSTEM, TOOLS, agent_turn  # noqa: E402
from leyline_policies import TruncateOlderThanN  # noqa: E402
from leyline_sdk import AsyncLeyline, HFChatTokenizer, LeylineSession  # noqa: E402
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer  # noqa: E402

SERVER = "import sys; from leyline_server.cli import main; sys.exit(main())"


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Any, what: str, timeout_s: float = 120.0) -> None:
    """Poll ``check()`` until it is true (``TimeoutError`` naming ``what`` after ``timeout_s``)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not come up in {timeout_s:.0f} s")


@contextlib.contextmanager
def replicas(
    n: int, model: str, extra: Sequence[str] = ("--kv-budget-mb", "64"), env: Mapping[str, str] | None = None
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """``n`` ``leyline-server`` processes on loopback ports: base URL → process (stopped at the end).

    ``extra``: more server arguments; ``env``: the processes' environment (default: this one's).
    """
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for _ in range(n):
            port = free_port()
            args = ["--model-path", model, "--port", str(port), "--log-level", "warning", *extra]
            procs[f"http://127.0.0.1:{port}"] = subprocess.Popen(
                [sys.executable, "-c", SERVER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
            )
        for url in procs:
            wait_until(lambda url=url: httpx.get(url + "/health").status_code == 200, f"replica {url}")
        yield procs
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=60)


@contextlib.contextmanager
def router(workers: list[str], model: str, policy: str = "manual", api_key: str | None = None) -> Iterator[str]:
    """SGLang's router (``policy``, health checked every second, no router-side retries) in front of
    ``workers``; yields its URL once a chat completion for ``model`` passes it (``api_key`` sent)."""
    port = free_port()
    args = ["--policy", policy, "--worker-urls", *workers, "--host", "127.0.0.1", "--port", str(port)]
    args += ["--prometheus-port", str(free_port()), "--disable-retries", "--log-level", "warn"]
    args += ["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-check-timeout-secs", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def passes() -> bool:
        return httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=60).status_code == 200

    try:
        wait_until(passes, "the router")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def agent(session: LeylineSession, index: int, model: str, first: int, last: int, log: list[Any]) -> None:
    """Turns ``first``..``last - 1`` of agent ``index``; each answer's ``leyline`` field goes to ``log``."""
    messages = session.history or [SYSTEM, {"role": "user", "content": f"Agent {index}: find the config parser."}]
    for turn in range(first, last):
        r = await session.create(model=model, messages=messages, max_tokens=4, temperature=0)
        log.append((index, turn, r.leyline))
        messages = [*messages, *agent_turn(turn, lines=12)]


def where(urls: list[str], session_id: str) -> str | None:
    """The replica whose own session table holds ``session_id`` (asked directly, not via the router)."""
    for url in urls:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/leyline/sessions/{session_id}").status_code == 200:
                return url
    return None


def table(title: str, log: list[Any], home: dict[str, str | None], stopped: str | None) -> None:
    """One row per replica: sessions, turns served, reused / rotated / prefilled tokens, fallbacks."""
    print(f"\n{title}")
    print(
        f"{'replica':<34} {'sessions':>8} {'turns':>6} {'reused':>7} {'rotated':>8} {'prefilled':>9} {'fallbacks':>9}"
    )
    for url in sorted(set(filter(None, home.values()))):
        rows = [ext for _, _, ext in log if home.get(ext["session_id"]) == url]
        sessions = {ext["session_id"] for ext in rows}
        falls = sum(ext["fallback"] is not None for ext in rows)
        sums = [sum(ext[k] for ext in rows) for k in ("reused_tokens", "rotated_tokens", "prefilled_tokens")]
        label = url + (" (stopped)" if url == stopped else "")
        print(f"{label:<34} {len(sessions):8d} {len(rows):6d} {sums[0]:7d} {sums[1]:8d} {sums[2]:9d} {falls:9d}")


async def run(args: argparse.Namespace) -> None:
    """Start the cluster, run the agents, stop one replica halfway, print the tables."""
    with replicas(args.replicas, args.model) as procs, router(list(procs), args.model) as url:
        urls = list(procs)
        print(f"{args.replicas} replicas of {args.model} behind SGLang's router at {url} (--policy manual)")
        client = AsyncLeyline(
            base_url=url + "/v1",
            policies=[TruncateOlderThanN(2)],
            tokenizer=HFChatTokenizer(load_tiny_tokenizer()),
            behind_router=True,
        )
        sessions = [client.session(tools=TOOLS) for _ in range(args.agents)]
        log: list[Any] = []
        half = args.turns // 2 + 1
        await asyncio.gather(*(agent(s, i, args.model, 0, half, log) for i, s in enumerate(sessions)))
        home = {ext["session_id"]: where(urls, ext["session_id"]) for _, _, ext in log}
        table(f"after {half} turns of {args.agents} agents:", log, home, None)

        load = {u: sum(h == u for h in home.values()) for u in urls}
        victim = max(load, key=lambda u: load[u])
        procs[victim].terminate()
        procs[victim].wait(timeout=60)
        print(f"\nstopped {victim} ({load[victim]} sessions on it); the agents continue")
        await asyncio.gather(*(agent(s, i, args.model, half, args.turns, log) for i, s in enumerate(sessions)))
        live = [u for u in urls if u != victim]
        home.update(
            {ext["session_id"]: where(live, ext["session_id"]) for _, _, ext in log if ext["session_id"] not in home}
        )
        table(f"after all {args.turns} turns:", log, home, victim)

        falls = [[s.fallback for s in session.stats] for session in sessions]
        moved = [f for f in falls if "base_mismatch" in f]
        again = all(f[half:] == ["base_mismatch"] + [None] * (args.turns - half - 1) for f in moved)
        turns = sum(len(f) for f in falls)
        print(f"\n{args.agents} agents finished {turns} turns, no error; {len(moved)} sessions moved (base_mismatch)")
        print("each moved session: one turn answered in full on a live replica, then spliced again: " + str(again))
        await client.close()


def main() -> None:
    """Parse the arguments and run the demo."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--agents", type=int, default=12)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--model", default="tiny-mla", help="a preset the local tokenizer renders (tiny-*)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

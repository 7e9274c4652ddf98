"""The real agent CLIs (Codex, Claude Code) from npm, run offline against a loopback server.

``make agents`` installs the pinned versions into ``.agents/`` (``make test`` does it first). Each
run gets its own home folder and configuration, and every outbound address but loopback is
refused: the proxy variables point at :class:`RefusingProxy`, a loopback port that answers 403 to
everything (CONNECT included), so a CLI's update checks or plugin syncs never wait on the network.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".agents" / "node_modules" / ".bin"
CODEX_VERSION = "0.171.0"
CLAUDE_VERSION = "2.1.197"

__all__ = ["BIN", "RefusingProxy", "Run", "codex", "claude", "installed"]


def installed(name: str) -> Path:
    """The CLI's path; a failure naming ``make agents`` when it is missing."""
    path = BIN / name
    if not path.exists():
        raise AssertionError(f"{path} is missing: run `make agents` (make test does)")
    return path


class RefusingProxy:
    """A loopback HTTP proxy that refuses every request with 403 and counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.attempts: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    head = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                    self.attempts.append(head)
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@dataclass
class Run:
    """What a CLI run returned."""

    returncode: int
    stdout: str
    stderr: str


def _shims(home: Path) -> Path:
    """A folder with ``python`` (the machine's ``python3``), as on a developer's machine: agents run it."""
    shims = home / "bin"
    shims.mkdir(parents=True, exist_ok=True)
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if found and not (shims / "python").exists():
        (shims / "python").symlink_to(found)
    return shims


def _env(home: Path, proxy: RefusingProxy, extra: dict[str, str]) -> dict[str, str]:
    env = {
        "PATH": f"{_shims(home)}:{BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TERM": "dumb",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        env[name] = proxy.url
    return {**env, **extra}


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Run:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    return Run(done.returncode, done.stdout, done.stderr)


def codex(
    home: Path, base_url: str, model: str, prompt: str, proxy: RefusingProxy, resume: bool = False,
    headers: dict[str, str] | None = None, timeout: float = 300, settings: str = "", json_events: bool = False,
) -> Run:  # fmt: skip
    """``codex exec`` (``resume``: ``codex exec resume --last``) against ``base_url`` (``…/v1``).

    ``settings``: more top-level ``config.toml`` lines (e.g. ``model_instructions_file = "…"``);
    ``json_events``: ``--json``, one event per line on stdout (Codex's own record of the commands
    it ran and their output).
    """
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    work = home / "work"
    work.mkdir(exist_ok=True)
    header_toml = ", ".join(f'"{k}" = "{v}"' for k, v in (headers or {}).items())
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "leyline"\napproval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\ncheck_for_update_on_startup = false\n' + settings + "\n"
        "[analytics]\nenabled = false\n\n[features]\nplugins = false\n\n"
        f'[model_providers.leyline]\nname = "Leyline"\nbase_url = "{base_url}"\nwire_api = "responses"\n'
        f'env_key = "LEYLINE_API_KEY"\nhttp_headers = {{ {header_toml} }}\n'
    )
    env = _env(home, proxy, {"CODEX_HOME": str(codex_home), "LEYLINE_API_KEY": "sk-local"})
    head = [str(installed("codex")), "exec"] + (["resume", "--last"] if resume else [])
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    flags += ["--json"] if json_events else []
    argv = head + flags + ([] if resume else ["--color", "never", "-C", str(work)]) + [prompt]
    return _run(argv, env, work, timeout)


def claude(
    home: Path, base_url: str, model: str, prompt: str, proxy: RefusingProxy, max_output: int = 256,
    headers: dict[str, str] | None = None, timeout: float = 300, tools: list[str] | None = None,
    env: dict[str, str] | None = None, json_events: bool = False, system_prompt: str | None = None,
) -> Run:  # fmt: skip
    """``claude -p`` against ``base_url`` (the server root, no ``/v1``).

    ``tools``: ``--tools`` (the tools Claude Code offers; default all); ``env``: more environment
    (e.g. ``CLAUDE_CODE_DISABLE_AUTO_MEMORY``); ``json_events``: ``--output-format stream-json``,
    Claude Code's own record of every message (its tool uses and their results) on stdout;
    ``system_prompt``: ``--system-prompt`` (replaces Claude Code's own).
    """
    config = home / "claude"
    config.mkdir(parents=True, exist_ok=True)
    work = home / "work"
    work.mkdir(exist_ok=True)
    extra = {
        "CLAUDE_CONFIG_DIR": str(config),
        "SHELL": "/bin/bash",
        "IS_SANDBOX": "1",  # --dangerously-skip-permissions as root
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-local",
        "ANTHROPIC_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output),
    }
    if headers:
        extra["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in headers.items())
    extra.update(env or {})
    output = ["--output-format", "stream-json", "--verbose"] if json_events else ["--output-format", "text"]
    offered = ["--tools", ",".join(tools)] if tools is not None else []
    system = ["--system-prompt", system_prompt] if system_prompt is not None else []
    argv = [str(installed("claude")), "-p", *offered, *system, "--dangerously-skip-permissions", *output, prompt]
    return _run(argv, _env(home, proxy, extra), work, timeout)


if os.environ.get("LEYLINE_AGENTS_BIN"):  # a local install elsewhere (development)
    BIN = Path(os.environ["LEYLINE_AGENTS_BIN"])

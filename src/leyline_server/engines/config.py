"""One frozen description of the engine to build: the CLI fills it, the factory and the loaders read it.

Before this object the CLI's flags travelled as keyword arguments through the factory into each
loader, and a flag one hop forgot was silently dropped. Now every engine-relevant flag is a field
here (``tests/server/test_engine_config.py`` checks that each flag of the CLI's model group
changes this object), and each loader takes the whole object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from leyline_server.engines.kv_budget import Budget, available_bytes, machine_budget

__all__ = [
    "CANARY_TOLERANCES",
    "DEFAULT_ROTATION_BUDGET",
    "DTYPES",
    "ENGINES",
    "FLASH_ATTN",
    "KV_CACHE_DTYPES",
    "EngineConfig",
    "canary_tolerance",
    "context_window",
]

ENGINES = ("embedded", "sglang", "llamacpp")
FLASH_ATTN = ("off", "on", "auto")  # --flash-attn: off, on, or llama.cpp decides
DTYPES = ("float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", *DTYPES)  # auto: llama.cpp's own default (float16); the weights' dtype elsewhere
DEFAULT_ROTATION_BUDGET = 64  # rotations one slot's key may take before a splice touching it is refused
# The layer-0 canary's largest relative key error, by the math that computes the reference keys and
# the KV dtype: torch (embedded, SGLang: the model's own layer-0 projection) and ggml (llama.cpp:
# a context stopped after layer 0). Measured margins in docs/design.md ("the canary").
CANARY_TOLERANCES: dict[str, dict[str, float]] = {
    "torch": {"float32": 1e-4, "float16": 2e-2, "bfloat16": 3e-2, "other": 1e-2},
    "ggml": {"float32": 2e-3, "float16": 2e-2, "bfloat16": 3e-2, "other": 2e-2},
}


def canary_tolerance(math: str, dtype: str, override: float | None = None) -> float:
    """The canary's tolerance for keys of ``dtype`` computed by ``math`` (``torch`` or ``ggml``);
    ``override`` (``--canary-tolerance``) wins."""
    if override is not None:
        return override
    table = CANARY_TOLERANCES[math]
    return table.get(dtype.removeprefix("torch."), table["other"])


@dataclass(frozen=True)
class EngineConfig:
    """What to serve and with what memory; immutable once built.

    * ``engine``: ``embedded``, ``llamacpp`` or ``sglang``; ``model``: a preset, a ``.gguf`` file
      or a checkpoint folder (``--model-path``); ``served_name``: the first ``--served-model-name``.
    * ``dtype``: the weights (embedded; a GGUF's weights are the file's), passed to SGLang when given.
    * ``kv_cache_dtype``: the KV cache (``--kv-cache-dtype``, as vLLM and SGLang name it): ``auto``
      is float16 on llama.cpp (llama.cpp's own default) and the weights' dtype on the embedded
      engine, which cannot keep its KV in another (:attr:`kv_dtype`).
    * ``preset_layers``: decoder layers of a tiny preset model.
    * ``kv_budget_mb``: the KV pool (``--kv-budget-mb``, or ``--mem-fraction-static`` resolved,
      ``kv_budget_from`` says which); ``None``: sized from the machine (:meth:`kv_budget`,
      :mod:`leyline_server.engines.kv_budget`).
    * ``context_length``: the longest prompt + completion asked for (``--context-length``); an
      engine whose pool or model cannot hold it refuses to start (:func:`context_window`).
      ``None``: the model's, capped by the pool.
    * ``prefix_cache``: ``False`` recomputes every prompt (``--disable-prefix-cache``).
    * ``swap_space_gb``: host memory the llama.cpp engine parks idle sequences in.
    * ``engine_args``: the sglang engine's command line (SGLang's flags, model path included).
    * ``rotation_budget``: rotations one slot's key may take before splices touching it fall back
      to ``drift_budget``; ``canary_tolerance``: the layer-0 canary's largest relative error
      (``None``: by KV dtype, :data:`CANARY_TOLERANCES`).
    * ``chunked_prefill_size``: prefill tokens per scheduler step; ``max_running_requests``: streams
      decoding in one step (the embedded and llama.cpp engines' scheduler,
      :mod:`leyline_server.engines.scheduler`; SGLang takes its own flags of these names).
    * ``threads``, ``threads_batch``: the llama.cpp engine's threads for decode steps and for prompt
      batches (``--threads``, ``--threads-batch``, as llama.cpp names them); ``None``: every core.
    * ``flash_attn``: the llama.cpp engine's flash attention, ``off`` (default), ``on`` or ``auto``
      (llama.cpp decides: on for the CPU, llama-server's default).
    """

    engine: str = "embedded"
    model: str = "tiny-mla"
    served_name: str | None = None
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    preset_layers: int = 2
    kv_budget_mb: float | None = None
    kv_budget_from: str = "--kv-budget-mb"
    context_length: int | None = None
    prefix_cache: bool = True
    swap_space_gb: float = 4.0
    engine_args: tuple[str, ...] = ()
    rotation_budget: int = DEFAULT_ROTATION_BUDGET
    canary_tolerance: float | None = None
    chunked_prefill_size: int = 256
    max_running_requests: int = 64
    threads: int | None = None
    threads_batch: int | None = None
    flash_attn: str = "off"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; engines: {', '.join(ENGINES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.kv_budget_mb is not None and not self.kv_budget_mb > 0:
            raise ValueError(f"--kv-budget-mb must be positive, not {self.kv_budget_mb}")
        if self.engine != "sglang" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            choices = ", ".join(KV_CACHE_DTYPES)
            raise ValueError(f"--kv-cache-dtype must be one of {choices}, not {self.kv_cache_dtype!r}")
        if self.engine == "embedded" and self.kv_cache_dtype not in ("auto", self.dtype):
            raise ValueError(
                f"--kv-cache-dtype {self.kv_cache_dtype}: the embedded engine keeps its KV in the weights' "
                f"dtype (--dtype {self.dtype}); use --dtype {self.kv_cache_dtype}"
            )
        if self.swap_space_gb < 0:
            raise ValueError("--swap-space must be 0 or more (GiB)")
        if self.preset_layers < 1:
            raise ValueError("--preset-layers must be at least 1")
        if self.context_length is not None and self.context_length < 1:
            raise ValueError("--context-length must be positive")
        if self.rotation_budget < 0:
            raise ValueError("--rotation-budget must be 0 or more")
        if self.canary_tolerance is not None and not self.canary_tolerance > 0:
            raise ValueError("--canary-tolerance must be positive")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"--flash-attn must be off, on or auto, not {self.flash_attn!r}")
        if any(t is not None and t < 1 for t in (self.threads, self.threads_batch)):
            raise ValueError("--threads and --threads-batch must be positive")
        if self.chunked_prefill_size < 1 or self.max_running_requests < 1:
            raise ValueError("--chunked-prefill-size and --max-running-requests must be positive")
        object.__setattr__(self, "engine_args", tuple(self.engine_args))

    @property
    def scheduling(self) -> dict[str, int]:
        """The scheduler's settings (keyword arguments of the threaded engines)."""
        return {"chunk_size": self.chunked_prefill_size, "max_running": self.max_running_requests}

    @property
    def kv_dtype(self) -> str:
        """The KV cache's dtype: ``--kv-cache-dtype``, with ``auto`` resolved for the engine."""
        if self.kv_cache_dtype != "auto":
            return self.kv_cache_dtype
        return "float16" if self.engine == "llamacpp" else self.dtype

    def kv_budget(self, positions: int, bytes_per_token: int, granule: int = 1) -> Budget:
        """The KV pool: ``kv_budget_mb`` when given, else sized from the machine for the served
        context (``context_length``, else the model's ``positions``) at ``bytes_per_token``."""
        if self.kv_budget_mb is not None:
            return Budget(self.kv_budget_mb, self.kv_budget_from)
        asked = self.context_length is not None
        served = self.context_length or positions
        return machine_budget(served, bytes_per_token, available_bytes(), asked, granule)

    @property
    def name(self) -> str:
        """The name the engine reports (the served name, else the model)."""
        return self.served_name or self.model


def context_window(asked: int | None, positions: int, capacity: int, bytes_per_token: int, granule: int = 1) -> int:
    """The context an engine serves: ``asked`` if the model and the KV pool can hold it, else refuse.

    ``positions``: the model's trained context; ``capacity``: tokens the KV pool holds;
    ``bytes_per_token`` and ``granule`` (the pool grows in steps of this many tokens) size the
    ``--kv-budget-mb`` the message asks for. Without ``asked``, the model's context capped by the
    pool. Refusing is what vLLM does when its KV cache cannot hold ``--max-model-len``: a
    context that is silently smaller than asked fails later, on a long request, with a 400.
    """
    if asked is None:
        return min(positions, capacity)
    if asked > positions:
        raise ValueError(f"--context-length {asked} is longer than the model's context of {positions} tokens")
    if asked > capacity:
        tokens = math.ceil(asked / granule) * granule
        need = math.ceil(tokens * bytes_per_token / 2**20)
        raise ValueError(
            f"--context-length {asked} does not fit the KV pool: it holds {capacity} tokens "
            f"({bytes_per_token:,} bytes each); raise --kv-budget-mb to at least {need} "
            "(or --mem-fraction-static to match), or lower --context-length"
        )
    return asked

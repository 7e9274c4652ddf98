"""A stand-in for ``sgl_kernel`` so SGLang's CPU engine starts without SGLang's CPU kernel library.

``sgl_kernel`` has no CPU wheel on PyPI. With ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports a handful
of ``*_cpu`` names from it at module level; with ``torch.ops.sgl_kernel`` left empty
(``cpu_has_amx_support()`` is False) its layers run their plain-torch ``forward_native`` paths and
call none of them, except :func:`assign_req_to_token_pool_cpu` (``mem_cache/allocation.py``,
every batch), implemented here in torch. Every other ``*_cpu`` name raises if called; any other
name is missing, and this is a module, not a package, so ``from sgl_kernel.x import ...`` fails as
on a machine without the library (SGLang guards those imports).

Test stand-in only: the product's CPU path is the embedded and llama.cpp engines.
"""

from __future__ import annotations

from typing import Any

import torch

__version__ = "0.0.0+leyline-cpu-stand-in"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of ``req_to_token``, as SGLang's Triton kernel does.

    Request ``i`` gets ``out_cache_loc[sum(len_j, j < i) : ... + len_i]`` at columns
    ``[start_offset[i], end_offset[i])`` of row ``req_pool_indices[i]``.
    """
    del pool_len  # the row length of ``req_to_token`` (the kernel addresses a flat buffer)
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = int(end) - int(start)
        req_to_token[int(row), int(start) : int(end)] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def _missing(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name}: not available in the CPU test stand-in")

    kernel.__name__ = name
    return kernel


def __getattr__(name: str) -> Any:
    if name.endswith("_cpu"):
        return _missing(name)
    raise AttributeError(f"module 'sgl_kernel' (CPU test stand-in) has no attribute {name!r}")

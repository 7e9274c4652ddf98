"""SGLang on CPU for the tests: an ``sglang.srt.plugins`` entry point run in every SGLang process.

SGLang 0.5.23's ``torch_native`` attention backend has no entry in DeepSeek's
``AttentionBackendRegistry``, so MLA models fall back to the Triton handler, which takes the MHA
path on a fresh prefill and fails in ``torch_native_backend.py`` with a size mismatch. Registering
``torch_native -> AttnForwardMethod.MLA`` (absorbed MLA for prefill and decode, which the
torch-native backend implements) makes tiny DeepSeek-V2/V3 models serve on CPU.

The entry point is declared by ``leyline_sglang_cpu_stubs-0.dist-info`` next to this file, found
through ``PYTHONPATH`` (nothing is installed). Test stand-in only, like ``sgl_kernel.py``.
"""

from __future__ import annotations

from typing import Any


def register() -> None:
    """Route DeepSeek attention on the torch-native backend to SGLang's MLA forward."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    def handle_attention_torch_native(attn: Any, forward_batch: Any) -> Any:
        return AttnForwardMethod.MLA

    AttentionBackendRegistry.register("torch_native", handle_attention_torch_native)

"""``GET /model_info`` and ``GET /server_info``: what SGLang's router probes when a worker registers.

SGLang's own server answers both (``sglang/srt/entrypoints/http_server.py``); SGLang's router asks
a worker for them at registration and warns when they are missing. Leyline answers with the
fields of SGLang's shape it can state truthfully, plus a ``leyline`` block saying what this
server does beyond OpenAI (the splice extension, its carriers and limits). Neither route needs
an API key (a router probes without one, as it probes ``/health``) and neither reveals anything
about sessions or keys.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter

from leyline_server.api.carrier import CARRIER_KEY
from leyline_server.api.deps import Service
from leyline_server.api.service import LeylineService

__all__ = ["router", "model_info", "server_info"]

router = APIRouter()


def _version() -> str:
    try:
        return version("leyline")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0+unknown"


def model_info(service: LeylineService) -> dict[str, Any]:
    """SGLang's ``/model_info`` shape: the served model, generation only, text only."""
    config = service.config
    return {
        "model_path": config.model_name,
        "tokenizer_path": config.model_name,
        "served_model_name": config.names[0],
        "served_model_names": list(config.names),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "context_length": service.context_tokens,
    }


def server_info(service: LeylineService) -> dict[str, Any]:
    """SGLang's ``/server_info`` shape, as far as it applies, and Leyline's capabilities."""
    info, config = service.engine.info, service.config
    return {
        "version": _version(),
        "model_path": config.model_name,
        "served_model_name": config.names[0],
        "context_length": service.context_tokens,
        "max_total_num_tokens": info.kv_capacity_tokens,
        "page_size": 1,
        "disable_radix_cache": False,
        "leyline": {
            "engine": info.engine,
            "splice_modes": ["amortize", "forget"] if info.shiftable else ["forget"],
            "unshiftable_reason": info.unshiftable_reason,
            "extension_carriers": ["leyline", f"metadata.{CARRIER_KEY}"],
            "routes": "/v1/leyline/*",
            "max_body_bytes": config.max_body_bytes,
            "max_directives": config.max_directives,
            "max_replacement_tokens": config.max_replacement_tokens,
            "auth": bool(config.api_keys),
        },
    }


@router.get("/model_info")
@router.get("/get_model_info", include_in_schema=False)
async def get_model_info(service: Service) -> dict[str, Any]:
    """The served model (SGLang's ``/model_info``; ``/get_model_info`` is its older name)."""
    return model_info(service)


@router.get("/server_info")
@router.get("/get_server_info", include_in_schema=False)
async def get_server_info(service: Service) -> dict[str, Any]:
    """The server's limits and capabilities (SGLang's ``/server_info``; also ``/get_server_info``)."""
    return server_info(service)

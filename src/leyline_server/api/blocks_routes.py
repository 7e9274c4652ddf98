"""``/v1/leyline/blocks``: precompiled KV blocks (create from tokens or messages, get, delete)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import APIError
from leyline_server.api.schemas import BlockCreateRequest
from leyline_server.blocks import Block

__all__ = ["router"]

router = APIRouter(prefix="/v1/leyline/blocks")


def _info(block: Block) -> dict[str, Any]:
    return {"id": block.id, "object": "leyline.block", "length": len(block.tokens), "tokens": block.tokens}


@router.post("")
async def create_block(body: BlockCreateRequest, key: Owner, service: Service) -> dict[str, Any]:
    """Prefill ``tokens`` (or the exact tokens of ``messages`` as the chat template renders them,
    without the template's preamble) once, and keep them as a block."""
    if (body.messages is None) == (body.tokens is None):
        raise APIError(400, "invalid_request", "give exactly one of 'messages' and 'tokens'")
    async with service.admission.slot(key) as ticket:
        if body.tokens is not None:
            tokens = list(body.tokens)
        else:
            tokens = await service.render.block_tokens(key, body.messages or [], body.tools)
        return _info(await service.open_block(key, tokens, ticket))


@router.get("/{block_id}")
async def get_block(block_id: str, key: Owner, service: Service) -> dict[str, Any]:
    """A block's tokens."""
    return _info(service.get_block(block_id, key))


@router.delete("/{block_id}")
async def delete_block(block_id: str, key: Owner, service: Service) -> dict[str, Any]:
    """Drop a block (its KV becomes ordinary evictable cache)."""
    service.blocks.drop(service.get_block(block_id, key))
    return {"id": block_id, "object": "leyline.block.deleted", "deleted": True}

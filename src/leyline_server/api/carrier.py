"""The ``leyline`` extension carried in OpenAI's ``metadata`` map, for gateways that drop it.

SGLang's router (and other OpenAI gateways) re-serialize a chat request into their own type and
drop every body field they do not know, ``leyline`` included, but keep OpenAI's ``metadata`` (a
map of strings). A client behind such a gateway sends the extension as a JSON string under
``metadata["leyline"]``; the server lifts it out before validation, so it is read exactly as the
``leyline`` field would be (same checks, same errors, which name ``leyline.…``). Sending both is
refused: the request would be ambiguous.

Size: the carrier is bounded only by the server's body limit (``--max-body-bytes``) and the
gateway's (SGLang's router: 512 MB by default); OpenAI's own 512-character limit on metadata
values is not applied, since directives' replacements are token lists.
"""

from __future__ import annotations

import json
from typing import Any

from leyline_server.api.limits import MAX_JSON_DEPTH, json_depth

__all__ = ["CARRIER_KEY", "lift_leyline"]

CARRIER_KEY = "leyline"


def lift_leyline(data: Any) -> Any:
    """Move ``metadata["leyline"]`` (a JSON string) to the request's ``leyline`` field.

    ``data`` is the raw request body (a dict, or anything else, passed through untouched for the
    schema to refuse). Raises ``ValueError`` when the carrier is not a JSON object or when the
    body also has a ``leyline`` field.
    """
    if not isinstance(data, dict):
        return data
    metadata = data.get("metadata")
    if not isinstance(metadata, dict) or CARRIER_KEY not in metadata:
        return data
    raw = metadata[CARRIER_KEY]
    if not isinstance(raw, str):
        return data  # the metadata schema refuses a non-string value, naming it
    if data.get("leyline") is not None:
        raise ValueError("metadata.leyline: the leyline extension was sent twice (field and metadata); send it once")
    try:
        extension = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"metadata.leyline: not valid JSON ({exc.msg} at {exc.pos})") from None
    except RecursionError:  # the parser's own bound: far past any extension
        raise ValueError(f"metadata.leyline: nested deeper than {MAX_JSON_DEPTH} levels") from None
    if json_depth(extension) > MAX_JSON_DEPTH:
        raise ValueError(f"metadata.leyline: nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(extension, dict):
        raise ValueError("metadata.leyline: must be a JSON object (the leyline extension)")
    rest = {k: v for k, v in metadata.items() if k != CARRIER_KEY}
    return {**data, "metadata": rest or None, "leyline": extension}

"""The client-edits opt-in: how the edits a plain client makes to its own history are served.

A plain client (one that sends no ``leyline`` field) edits its history between turns: it clears
old tool results, drops messages, summarises. The request's ``X-Leyline-Client-Edits`` header,
else the server's ``--splice-client-edits``, says what it wants (:func:`client_edits_mode`):

* ``amortize`` — its edits are spliced in place (approximate KV for this client);
* ``exact`` — every edit, the client's and the chat template's, is recomputed from its first
  token, and no approximate KV left by an earlier turn is continued: what a fresh prefill gives;
* neither — the server's default (``--auto-splice``: the template's edits spliced, the client's
  recomputed; without it, no conversation sessions on chat completions).

:mod:`leyline_server.api.conversations` applies the mode.
"""

from __future__ import annotations

from leyline_sdk.core.directives import Mode
from leyline_server.api.errors import APIError

__all__ = ["CLIENT_EDITS_HEADER", "client_edits_mode"]

CLIENT_EDITS_HEADER = "x-leyline-client-edits"  # "amortize": splice this client's own edits; "exact": recompute


def client_edits_mode(header: str | None, server_default: bool) -> Mode | None:
    """The mode of a plain client's own edits: the header's, else the server's (``--splice-client-edits``).

    ``None`` when the header is absent and the server does not splice client edits; 400 for an
    unknown value.
    """
    if header is None:
        return Mode.AMORTIZE if server_default else None
    value = header.strip().lower()
    if value in ("amortize", "splice", "on", "1", "true"):
        return Mode.AMORTIZE
    if value in ("exact", "forget", "off", "0", "false"):
        return Mode.FORGET
    raise APIError(400, "invalid_header", f"{CLIENT_EDITS_HEADER}: {header!r} is not 'amortize' or 'exact'")

"""The client-edits opt-in: how the edits a plain client makes to its own history are served.

A plain client (one that sends no ``leyline`` field) edits its history between turns: it clears
old tool results, drops messages, summarises. In one sentence: those edits are recomputed
(``exact``) unless the request (``X-Leyline-Client-Edits: amortize``) or the operator
(``--client-edits amortize``; older spelling ``--splice-client-edits``) asks for ``amortize``,
and a request that says ``exact`` gets exact KV whatever the server's defaults
(:func:`client_edits_mode`):

* ``amortize`` — its edits are spliced in place (approximate KV for this client);
* ``exact`` in the header — every edit, the client's and the chat template's, is recomputed from
  its first token, and no approximate KV left by an earlier turn is continued: what a fresh
  prefill gives;
* no header — the server's ``--client-edits`` (``exact`` by default: the client's edits are
  recomputed, and ``--auto-splice`` alone decides the template's).

:mod:`leyline_server.api.conversations` applies the mode.
"""

from __future__ import annotations

from leyline_sdk.core.directives import Mode
from leyline_server.api.errors import APIError

__all__ = ["CLIENT_EDITS_HEADER", "client_edits_mode"]

CLIENT_EDITS_HEADER = "x-leyline-client-edits"  # "amortize": splice this client's own edits; "exact": recompute


def client_edits_mode(header: str | None, server_default: str = "exact") -> Mode | None:
    """The mode of a plain client's own edits: the header's, else the server's (``--client-edits``).

    ``None`` when the header is absent and the server's default is ``exact`` (the request then
    gets a conversation only under ``--auto-splice`` or from its protocol); 400 for an unknown value.
    """
    if header is None:
        return Mode.AMORTIZE if server_default == "amortize" else None
    value = header.strip().lower()
    if value in ("amortize", "splice", "on", "1", "true"):
        return Mode.AMORTIZE
    if value in ("exact", "forget", "off", "0", "false"):
        return Mode.FORGET
    raise APIError(400, "invalid_header", f"{CLIENT_EDITS_HEADER}: {header!r} is not 'amortize' or 'exact'")

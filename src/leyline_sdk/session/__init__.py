"""The session layer: one conversation with the server, its state, and its requests (no openai here).

``LeylineSession`` (:mod:`.session`) prepares and records turns; its state lives in ``History``
(:mod:`.history`: the agent's histories), ``ServerView`` (:mod:`.server_view`: what the server
holds) and, per request, ``PreparedTurn`` (:mod:`.turn`). :mod:`.planner` computes the
directives, :mod:`.ops` makes the session's other requests, :mod:`.renderer` renders prompts as
the server does, :mod:`.blocks` is the blocks API, :mod:`.gateway` the router mode, and
:mod:`.port` the one way to the server (implemented by the client layer over openai-python).
"""

from leyline_sdk.session.session import LeylineSession
from leyline_sdk.session.stats import TurnStats

__all__ = ["LeylineSession", "TurnStats"]

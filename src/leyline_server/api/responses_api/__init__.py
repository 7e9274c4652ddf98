"""OpenAI's Responses API (``/v1/responses``) as an adapter onto the one chat turn (:mod:`.routes`)."""

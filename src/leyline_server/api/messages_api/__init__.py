"""Anthropic's Messages API (``/v1/messages``) as an adapter onto the one chat turn."""

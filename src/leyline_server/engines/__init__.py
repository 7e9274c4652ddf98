"""Serving engines: embedded (default) and SGLang."""

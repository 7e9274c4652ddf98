"""The core layer: what a directive is, the wire format, the fallback vocabulary, errors, argument checks.

Pure: depends on pydantic only. Everything else in the SDK, the server and ``leyline_policies``
builds on it.
"""

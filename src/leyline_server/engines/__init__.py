"""Engines: where the KV cache lives, behind :mod:`leyline_server.contract`; ``factory`` builds one from flags."""

"""Engines: where the KV cache lives. ``base`` is the contract; ``factory`` builds one from flags."""

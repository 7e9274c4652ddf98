"""The engine contract, below both ``engines/`` and ``splice/``: what an engine promises (``base``:
the protocols and their invariants), the values that cross it (``values``, ``jobs``, ``logits``)
and what a splice reports (``report``). It imports neither engines nor the splice executor."""

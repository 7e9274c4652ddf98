"""The policy layer: the contracts shared with ``leyline_policies``.

``edits`` (``Conversation``, ``Edit``, ``apply_edits``), ``errata``, ``contracts`` (``Policy``,
``PolicyBase``, ``Chain``, ``as_policy``) and ``run`` (``run_policies``, ``EditReport``).
"""

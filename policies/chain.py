"""Chain: run policies in order, each on the conversation as the previous ones left it.

Defined in the SDK's pure core (``leyline_sdk.policy.contracts``, where ``PolicyBase.__or__`` needs it).
"""

from leyline_sdk.policy.contracts import Chain

__all__ = ["Chain"]

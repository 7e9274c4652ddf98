"""The client layer: everything that touches openai-python.

``AsyncLeyline`` / ``Leyline`` (:mod:`.client`), their ``chat.completions`` (:mod:`.completions`,
one call in :mod:`.calls`), the session registry they share with their copies (:mod:`.registry`),
their options (:mod:`.options`), the session layer's port over openai's transport
(:mod:`.routes`), the blocking wrappers (:mod:`.sync`) and ``SpliceFallbackError``
(:mod:`.fallback`).
"""

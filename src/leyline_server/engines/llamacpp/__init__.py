"""The llama.cpp engine: GGUF models on the CPU, sessions as sequences of one unified KV pool.

``lib`` wraps llama-cpp-python's C API, ``cache`` keeps sequences as cache entries (sharing,
privacy, eviction), ``stage`` and ``engine`` implement the splice backend, ``serving`` the
service-facing engine, ``loader`` builds it from a model name, ``convert`` writes tiny models as GGUF.
"""

"""The grammar cache never makes a request wait for another constraint's compile.

Round two's finding: starting a constrained stream looked the grammar up under the lock that a
slow compile of another request held (on a worker thread), so the event loop froze for the length
of that compile. The oracle is ordering, with real xgrammar compiles: while a 1,000-property
schema (seconds to compile) is still compiling on another thread, a cached constraint's lookup
and a small new one's compile both return.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_server.contract.values import Constraint, ConstraintError
from leyline_server.engines.grammar import GrammarBackend


def schema(properties: int) -> Constraint:
    props = {f"p{i}": {"type": "integer"} for i in range(properties)}
    return Constraint(kind="json_schema", value=json.dumps({"type": "object", "properties": props}))


def test_a_cached_and_a_small_constraint_do_not_wait_for_a_slow_compile():
    tokenizer = load_tiny_tokenizer()
    backend = GrammarBackend(tokenizer, len(tokenizer), [0])
    cached, small, slow = schema(1), schema(2), schema(1000)
    backend.compile(cached)
    worker = threading.Thread(target=backend.compile, args=(slow,))
    worker.start()
    time.sleep(0.3)  # the slow compile has begun (it takes seconds)
    assert worker.is_alive()
    backend.compile(cached)
    backend.mask(small)
    assert worker.is_alive(), "the lookups waited for the 1,000-property compile to end"
    worker.join()
    assert backend.compile(slow) is backend.compile(slow)  # cached once it is done


def test_equal_constraints_compile_once_and_errors_reach_every_waiter():
    tokenizer = load_tiny_tokenizer()
    backend = GrammarBackend(tokenizer, len(tokenizer), [0])
    slow = schema(600)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(backend.compile(slow))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(r is results[0] for r in results)
    bad = Constraint(kind="regex", value="(")
    for _ in range(2):  # the failure is not cached as pending: the second try fails the same way
        with pytest.raises(ConstraintError):
            backend.compile(bad)

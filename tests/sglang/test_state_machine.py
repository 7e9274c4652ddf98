"""Random splices, forgets, requests, releases and evictions on SGLang's real cache (CPU), invariants after each.

After every step: no slot leaked, owned twice or freed twice (SGLang's own idle invariant plus an
exact census of the tree's values and the allocator's free list); every session's tokens equal
``apply`` of its history; its cached layer-0 rows equal a fresh forward of its tokens (the oracle
that holds at any depth); and no other namespace matches any of its rotated KV. The fill is the
harness's test double (a tiny transformers model writes the rows SGLang would compute).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.sglang.backend import namespace
from leyline_server.splice import splice
from tests.sglang.harness import Runtime
from tests.sglang.test_splice import backend, layer0_error, pinned_slots

token = st.integers(min_value=7, max_value=1000)


@st.composite
def directive_sets(draw, length: int):
    k = draw(st.integers(1, 3))
    cuts = sorted(draw(st.lists(st.integers(0, length), min_size=2 * k, max_size=2 * k)))
    return [
        Directive(
            start=cuts[2 * i],
            end=cuts[2 * i + 1],
            replacement=draw(st.lists(token, max_size=4)),
            mode=draw(st.sampled_from(["amortize", "amortize", "forget"])),
        )
        for i in range(k)
    ]


class SGLangCacheMachine(RuleBasedStateMachine):
    @initialize(variant=st.sampled_from([("mla", "rust"), ("mha", "python"), ("mla", "python"), ("mha", "rust")]))
    def start(self, variant):
        kind, core = variant
        self.rt = Runtime(kind, pool_tokens=260, core=core)
        self.be = backend(self.rt)
        self.sessions = {}  # name -> (handle, expected tokens)

    def _scope(self, name):
        return CacheScope(salt="k", private=name)

    @rule(name=st.sampled_from("abc"), prompt=st.lists(token, min_size=1, max_size=30))
    def request(self, name, prompt):
        previous = self.sessions.get(name)
        tokens = (previous[1] if previous else []) + prompt
        if len(tokens) > 120:
            return
        result = self.be.prefill(tokens, self._scope(name), previous=previous[0] if previous else None)
        self.sessions[name] = (result.handle, tokens)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def edit(self, data):
        name = data.draw(st.sampled_from(sorted(self.sessions)))
        handle, expected = self.sessions[name]
        directives = data.draw(directive_sets(len(expected)))
        handle, report = splice(self.be, handle, SpliceRequest(directives, base_length=len(expected)))
        assert report.applied or report.fallback.code == "capacity", report
        self.sessions[name] = (handle, apply(expected, directives))

    @precondition(lambda self: self.sessions)
    @rule(name=st.sampled_from("abc"))
    def close(self, name):
        if name in self.sessions:
            self.be.release(self.sessions.pop(name)[0])

    @rule(n=st.integers(0, 300))
    def evict(self, n):
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.rt.tree.evict(EvictParams(num_tokens=n))

    @rule(prompt=st.lists(token, min_size=1, max_size=40))
    def stranger(self, prompt):  # a request without a session, in the shared namespace
        if self.rt.control("probe", {"tokens": prompt, "ns": "k"})["room"] >= len(prompt):
            self.rt.prefill(prompt, "k")

    @invariant()
    def consistent(self):
        if not hasattr(self, "rt"):
            return
        self.rt.check()
        for name, (handle, expected) in self.sessions.items():
            assert handle.tokens == expected
            assert layer0_error(self.rt, handle) < 1e-4
            private = set(pinned_slots(self.rt, handle)[handle.exact :].tolist())
            for other in [CacheScope(salt="k")] + [self._scope(n) for n in "abc" if n != name]:
                length, node = self.rt.match(handle.tokens, namespace(other))
                seen = self.rt.tree.path_device_indices(node).tolist() if length else []
                assert not private & set(seen), "another namespace matched this session's rotated KV"


SGLangCacheMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
TestSGLangCache = SGLangCacheMachine.TestCase

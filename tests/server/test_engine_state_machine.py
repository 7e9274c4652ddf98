"""Many turns over many sessions: generate, splice, forget, evict — invariants after every step.

After each step: every session's tokens equal ``apply`` of its own history; its cached layer-0
rows equal the model's own keys at their positions (the splice oracle that holds at any depth);
every slot is free, owned by one node or in flight — exactly once.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import SamplingParams
from tests.server.engine_helpers import engine, layer0_oracle_error, prefill, run_splice

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


class EngineMachine(RuleBasedStateMachine):
    @initialize(preset=st.sampled_from(["tiny-mla", "tiny-mla-v3", "tiny-gqa"]))
    def start(self, preset):
        self.eng = engine(preset, layers=2, kv_budget_mb=0.5)
        self.sessions = {}  # name -> (pinned, expected tokens)

    @rule(
        name=st.sampled_from("abcd"),
        prompt=st.lists(token, min_size=2, max_size=30),
        n=st.integers(0, 4),
    )
    def generate(self, name, prompt, n):
        previous = self.sessions.get(name)
        tokens = (previous[1] if previous else []) + prompt
        pinned, logits, _ = prefill(self.eng, tokens, previous=previous[0] if previous else None)
        steps = list(self.eng.decode(pinned, logits, SamplingParams(max_tokens=n)))
        self.sessions[name] = (pinned, tokens + [s.token for s in steps])

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def edit(self, data):
        name = data.draw(st.sampled_from(sorted(self.sessions)))
        pinned, expected = self.sessions[name]
        directives = data.draw(directive_sets(len(expected)))
        pinned, report = run_splice(self.eng, pinned, directives, base_length=len(expected))
        assert report.applied, report
        self.sessions[name] = (pinned, apply(expected, directives))

    @precondition(lambda self: self.sessions)
    @rule(name=st.sampled_from("abcd"))
    def close(self, name):
        if name in self.sessions:
            pinned, _ = self.sessions.pop(name)
            self.eng.release(pinned)

    @rule(n=st.integers(0, 200))
    def evict(self, n):
        self.eng.pool.free(self.eng.radix.evict(n))

    @invariant()
    def consistent(self):
        if not hasattr(self, "eng"):
            return
        self.eng.check_integrity()
        for pinned, expected in self.sessions.values():
            assert pinned.tokens == expected
            assert len(pinned.slots) >= len(expected) - 1
            assert layer0_oracle_error(self.eng, pinned) <= 1e-4


TestEngineMachine = pytest.mark.slow(EngineMachine.TestCase)
TestEngineMachine.settings = settings(
    max_examples=30,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

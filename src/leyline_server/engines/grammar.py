"""Constrained decoding with xgrammar: a :class:`~leyline_server.contract.base.Constraint` compiled
for one tokenizer, and a per-request mask over the logits row (a logits processor, see
``engines.logits``).

Used by the engines that sample in this process (embedded, llama.cpp); SGLang applies the same
constraint with its own xgrammar backend. JSON schemas compile with fixed whitespace (``", "`` and
``": "`` separators, no newlines): small models asked for JSON with free whitespace can emit
whitespace until ``max_tokens``. The API checks and rewrites schemas before they get here
(:mod:`leyline_server.structured.schema`), so every complete output validates.

Compiled grammars are kept in a small LRU keyed by the constraint (xgrammar's own compiler cache
is off: it mixes up token-level structural tags of different shapes in 0.2.x).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import torch

from leyline_server.contract.values import Constraint, ConstraintError

__all__ = ["GrammarBackend", "GrammarMask"]

_XGR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # "[15:48:25] /project/cpp/x.cc:94: "


def _message(exc: BaseException) -> str:
    return _XGR_PREFIX.sub("", str(exc).strip()).strip()


class GrammarMask:
    """One request's grammar state: masks each logits row, advances on each sampled token."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.vocab_size = vocab_size

    def apply(self, logits: torch.Tensor) -> None:
        """Set every token the grammar forbids next to ``-inf`` (in place)."""
        if self.matcher.fill_next_token_bitmask(self.bitmask):
            row = logits.view(1, -1)
            self._xgr.apply_token_bitmask_inplace(row, self.bitmask, vocab_size=min(self.vocab_size, row.shape[1]))

    def accept(self, token: int) -> None:
        """Advance the grammar by the sampled token (always one the mask allowed)."""
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token}, which its own mask allowed")

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete and its stop token was taken."""
        return bool(self.matcher.is_terminated())


class GrammarBackend:
    """Compiles constraints for one tokenizer (thread-safe); hands out :class:`GrammarMask` s."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int], cache_size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.cache_size = cache_size
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._pending: dict[Constraint, Future[Any]] = {}  # compiles in flight, shared by equal constraints
        self._lock = threading.Lock()  # guards the two maps only: never held while compiling
        self._compiler_lock = threading.Lock()
        self._compiler: Any = None

    def _get_compiler(self) -> Any:
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _compile(self, constraint: Constraint) -> Any:
        compiler = self._get_compiler()
        kind, value = constraint.kind, constraint.value
        if kind == "json_schema":
            return compiler.compile_json_schema(value, any_whitespace=False, strict_mode=True)
        if kind == "regex":
            return compiler.compile_regex(value)
        if kind == "ebnf":
            return compiler.compile_grammar(value)
        return compiler.compile_structural_tag(value)

    def cached(self, constraint: Constraint) -> bool:
        """Whether ``constraint``'s grammar is in the cache (a :meth:`compile` would return at once)."""
        with self._lock:
            return constraint in self._compiled

    def compile(self, constraint: Constraint) -> Any:
        """xgrammar's compiled grammar for ``constraint``; :class:`ConstraintError` when it cannot be built.

        A cached grammar is returned at once, whatever else is compiling; different constraints
        compile concurrently; a caller asking for one already compiling waits for that compile.
        """
        with self._lock:
            hit = self._compiled.get(constraint)
            if hit is not None:
                self._compiled.move_to_end(constraint)
                return hit
            pending = self._pending.get(constraint)
            mine = pending is None
            if pending is None:
                pending = self._pending[constraint] = Future()
        if not mine:
            return pending.result()
        try:
            compiled = self._compile(constraint)
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError / its own types
            error = exc if isinstance(exc, ConstraintError) else ConstraintError(
                f"cannot compile the {constraint.kind}: {_message(exc)}")  # fmt: skip
            with self._lock:
                del self._pending[constraint]
            pending.set_exception(error)
            raise error from exc
        with self._lock:
            self._compiled[constraint] = compiled
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
            del self._pending[constraint]
        pending.set_result(compiled)
        return compiled

    def mask(self, constraint: Constraint) -> GrammarMask:
        """A fresh mask for one request (compiles, or takes the cached grammar)."""
        return GrammarMask(self.compile(constraint), self.vocab_size)

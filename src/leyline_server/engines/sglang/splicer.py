"""Leyline's splice primitives inside one SGLang scheduler rank, on SGLang's own tree, allocator and pool.

Every operation runs inside one control-request handler, between two batches, and leaves every
slot either free in the allocator or owned by the tree (locked when a handle pins it): SGLang's
idle check ``available + evictable + protected == total`` holds after each of them.

Per-slot marks (``marks[slot]``, on the pool's device): 0 = exact KV; ``k > 0`` = moved KV
(approximate), rotated ``k - 1`` times. SGLang reuses slots without telling anyone, so the
allocator's ``alloc`` is wrapped to clear the marks of every slot it hands out. A path's exact
length is the position of its first marked slot: in a trie everything after a moved row was
computed attending to it.

Operations (``handle(op, args) -> reply``; keys are token lists, ``ns`` the ``cache_salt``):

* ``info`` — model and pool facts, the RoPE spec, and what this runtime cannot splice;
* ``probe`` — cached prefix length of ``tokens``, the room (free + evictable slots once that
  prefix is locked, as SGLang's admission counts it) and what a request for ``tokens`` needs;
* ``pin`` / ``unpin`` — lock / unlock the cached prefix of ``tokens`` under a pin id;
* ``counts`` — rotations of the pinned slots at ``positions``;
* ``canary`` — the layer-0 rows the moves will copy (each from its own pinned source: the session's
  path or a block's), rotated in scratch with the kernel a move uses, compared with the model's own
  layer-0 keys of the tokens at their new positions (:mod:`.layer0`);
* ``extend`` — ``prefix`` must be cached in ``ns``: allocate slots for ``runs`` of the pinned
  handle, copy-rotate them there and insert ``prefix + tokens`` (SGLang frees duplicates).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.engines.config import canary_tolerance
from leyline_server.engines.sglang.layer0 import KeyFunction, layer0_key_function
from leyline_server.engines.sglang.rotary import find_rotary, first_differing_layer, rope_spec_from_rotary
from leyline_server.kernels import rotate_copy_layers
from leyline_server.rope import RopeSpec

__all__ = ["KVLayers", "SchedulerSplicer", "kv_layers"]
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class OpError(Exception):
    """A refused operation: ``code`` travels to the main process."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class KVLayers:
    """The pool's per-layer buffers as Leyline rotates them (MLA rows ``[latent | k_pe]``)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor] | None
    kind: str
    rotary_offset: int


def kv_layers(pool: Any) -> KVLayers | str:
    """The buffers of SGLang's MHA or MLA token pool, or why this pool cannot be spliced."""
    name = type(pool).__name__
    if getattr(pool, "store_dtype", None) != getattr(pool, "dtype", None) or pool.dtype not in _DTYPES:
        dtype = getattr(pool, "store_dtype", "?")
        return f"KV cache dtype {dtype} (quantized KV cannot be rotated; use --kv-cache-dtype auto)"
    if name == "MLATokenToKVPool":
        if getattr(pool, "use_dsa", False):
            return "DSA (sparse attention) KV pools are not supported"
        return KVLayers(list(pool.kv_buffer), None, "mla", int(pool.kv_lora_rank))
    if name == "MHATokenToKVPool":
        if getattr(pool, "kv_cache_layout", "nhd") != "nhd":
            return f"KV layout {pool.kv_cache_layout!r} (only the default NHD layout; unset SGLANG_USE_HND_KVCACHE)"
        return KVLayers(list(pool.k_buffer), list(pool.v_buffer), "mha", 0)
    return f"KV pool {name} is not supported (MHATokenToKVPool or MLATokenToKVPool only)"


def _key(tokens: list[int], ns: str | None) -> Any:
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", tokens), extra_key=None, cache_salt=ns)


class SchedulerSplicer:
    """The scheduler-side half of the SGLang engine (see the module docstring).

    ``layer0`` computes the model's own layer-0 keys (the canary's reference; ``None``: the
    canary is unavailable); ``refusals`` lists what this runtime cannot splice; ``facts`` is what
    ``info`` reports; ``sync`` orders our kernels after SGLang's in-flight forward (CUDA streams).
    """

    def __init__(
        self,
        tree: Any,
        allocator: Any,
        layers: KVLayers,
        spec: RopeSpec,
        layer0: KeyFunction | None,
        refusals: list[str] | None = None,
        facts: dict[str, Any] | None = None,
        sync: Callable[[], None] = lambda: None,
    ) -> None:
        self.tree, self.allocator, self.layers, self.spec, self.layer0 = tree, allocator, layers, spec, layer0
        self.refusals = list(refusals or [])
        self.facts = dict(facts or {})
        self.sync = sync
        self.pins: dict[int, Any] = {}
        device = layers.keys[0].device
        self.marks = torch.zeros(int(allocator.size) + 1, dtype=torch.int32, device=device)
        self._wrap_alloc()

    def _wrap_alloc(self) -> None:
        original = self.allocator.alloc
        marks = self.marks

        def alloc(need_size: int, *args: Any, **kwargs: Any) -> Any:
            out = original(need_size, *args, **kwargs)
            if out is not None and out.numel():
                marks[out] = 0
            return out

        self.allocator.alloc = alloc

    # -- dispatch -----------------------------------------------------------------------------------
    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run one operation; ``{"ok": False, "code", "message"}`` when it is refused."""
        method = getattr(self, f"op_{op}", None)
        if method is None:
            return {"ok": False, "code": "unknown_op", "message": f"unknown operation {op!r}"}
        try:
            return {"ok": True, **method(**args)}
        except OpError as exc:
            return {"ok": False, "code": exc.code, "message": str(exc)}

    # -- tree helpers -------------------------------------------------------------------------------
    def _match(self, tokens: list[int], ns: str | None) -> tuple[int, Any]:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        result = self.tree.match_prefix(MatchPrefixParams(key=_key(tokens, ns)))
        return int(result.device_prefix_len), result.last_device_node

    def _lock(self, length: int, node: Any) -> Any:
        return self.tree.lock(node) if length else None

    def _path(self, lock: Any) -> torch.Tensor:
        if lock is None:
            return torch.empty(0, dtype=torch.int64, device=self.marks.device)
        return self.tree.path_device_indices(lock.node).to(torch.int64)

    def _pinned(self, pin: int) -> torch.Tensor:
        if pin not in self.pins:
            raise OpError("unknown_pin", f"pin {pin} is not held")
        return self._path(self.pins[pin])

    def _exact(self, path: torch.Tensor) -> int:
        moved = torch.nonzero(self.marks[path] > 0)
        return int(moved[0, 0]) if moved.numel() else int(path.numel())

    def _alloc(self, n: int) -> torch.Tensor:
        slots = self.allocator.alloc(n)
        if slots is None:
            self.allocator.evict_to_free_tokens(self.tree, n)
            slots = self.allocator.alloc(n)
        if slots is None:
            raise OpError(
                FallbackCode.CAPACITY.value, f"need {n} KV slots, {self.allocator.available_size()} free after eviction"
            )
        return slots

    # -- operations ---------------------------------------------------------------------------------
    def op_info(self) -> dict[str, Any]:
        """Model, pool and RoPE facts, and the reasons this runtime cannot splice (if any)."""
        return {
            **self.facts,
            "kind": self.layers.kind,
            "layers": len(self.layers.keys),
            "dtype": str(self.layers.keys[0].dtype).removeprefix("torch."),
            "pool_tokens": int(self.allocator.size),
            "spec": self.spec.model_dump(mode="json"),
            "refusals": self.refusals,
        }

    def op_probe(self, tokens: list[int], ns: str | None, max_new: int = 1) -> dict[str, Any]:
        """How much of ``tokens`` is cached, the room, and what SGLang admits a request for them with.

        SGLang admits a request only when its new tokens, its ``max_new_tokens`` (clipped at
        ``CLIP_MAX_NEW_TOKENS``) and one page fit in the free plus evictable slots, its own
        cached prefix locked (``schedule_policy.PrefillAdder.add_one_req``); otherwise the
        request waits, for good if pinned sessions hold the rest. ``room`` and ``need`` count
        the same way, so the engine refuses (``CapacityError``) instead of queueing forever.
        """
        from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

        matched, node = self._match(tokens, ns)
        lock = self._lock(matched, node)
        try:
            room = int(self.allocator.available_size()) + int(self.tree.evictable_size())
        finally:
            self.tree.unlock(lock)
        extend = len(tokens) - min(matched, max(len(tokens) - 1, 0))  # SGLang recomputes the last token
        need = extend + min(max_new, CLIP_MAX_NEW_TOKENS) + int(getattr(self.allocator, "page_size", 1))
        return {"matched": matched, "room": room, "need": need}

    def op_pin(self, pin: int, tokens: list[int], ns: str | None) -> dict[str, Any]:
        """Lock the cached prefix of ``tokens`` under ``pin``: its length and how much of it is exact."""
        if pin in self.pins:
            raise OpError("pin_taken", f"pin {pin} is already held")
        length, node = self._match(tokens, ns)
        self.pins[pin] = self._lock(length, node)
        return {"cached": length, "exact": self._exact(self._path(self.pins[pin]))}

    def op_unpin(self, pin: int) -> dict[str, Any]:
        """Unlock ``pin`` (its path becomes evictable); unknown pins are ignored."""
        self.tree.unlock(self.pins.pop(pin, None))
        return {}

    def op_counts(self, pin: int, positions: list[int]) -> dict[str, Any]:
        """How often the keys at ``positions`` of the pinned path were rotated."""
        slots = self._pinned(pin)[torch.as_tensor(positions, dtype=torch.int64, device=self.marks.device)]
        return {"counts": (self.marks[slots] - 1).clamp(min=0).tolist()}

    def op_canary(
        self, sources: list[list[int]], new: list[int], tokens: list[int], tolerance: float | None = None
    ) -> dict[str, Any]:
        """The layer-0 canary: ``sources[i]`` = ``(pin, old position)`` of the row that lands at ``new[i]``.

        Each row is read from its own pinned path, rotated from its old to its new position in
        scratch with the move's kernel, and compared with the model's own layer-0 keys of
        ``tokens[i]`` at ``new[i]``; ``ran`` is False without a key function. ``tolerance``: the
        server's ``--canary-tolerance`` (default: by the pool's dtype).
        """
        tolerance = canary_tolerance("torch", str(self.layers.keys[0].dtype), tolerance)
        if self.layer0 is None or not sources or not self.spec.shiftable:
            return {"ran": False, "error": 0.0, "tolerance": tolerance}
        device = self.marks.device
        paths = {pin: self._pinned(pin) for pin in {int(s[0]) for s in sources}}
        if any(not 0 <= int(old) < paths[int(pin)].numel() for pin, old in sources):
            raise OpError("bad_request", "a canary row lies past its pinned (cached) tokens")
        slots = torch.stack([paths[int(pin)][int(old)] for pin, old in sources])
        old_t = torch.as_tensor([int(s[1]) for s in sources], dtype=torch.int64, device=device)
        new_t = torch.as_tensor(new, dtype=torch.int64, device=device)
        self.sync()
        rows = self.layers.keys[0].index_select(0, slots)  # [n, H, D]
        idx = torch.arange(len(sources), device=device)
        rotate_copy_layers([rows], idx, idx, old_t, new_t, self.spec)  # in place, the move's kernel
        expected = self.layer0(torch.as_tensor(tokens, dtype=torch.int64, device=device), new_t).double()
        if expected.shape != rows.shape:
            raise OpError("canary_shape", f"layer-0 keys {tuple(expected.shape)} vs pool rows {tuple(rows.shape)}")
        error = (rows.double() - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)
        return {"ran": True, "error": error, "tolerance": tolerance}

    def op_extend(
        self, pin: int, ns: str | None, prefix: list[int], runs: list[list[int]], tokens: list[int]
    ) -> dict[str, Any]:
        """Insert ``prefix + tokens``: the runs of the pinned handle, copy-rotated to their new positions."""
        device = self.marks.device
        old = torch.cat([torch.arange(a, b) for a, b, _ in runs]).to(device)
        new = torch.cat([torch.arange(s, s + b - a) for a, b, s in runs]).to(device)
        if old.numel() != len(tokens) or (runs and runs[0][2] != len(prefix)):
            raise OpError("bad_request", "runs do not match the prefix and tokens")
        source = self._pinned(pin)
        if int(old.max()) >= source.numel():
            raise OpError("bad_request", "a run lies past the pinned (cached) tokens")
        length, node = self._match(prefix, ns)
        if length < len(prefix):
            raise OpError("missing_prefix", f"{length} of the prefix's {len(prefix)} tokens are cached")
        lock = self._lock(length, node)
        try:
            self._move(source[old], old, new, self._path(lock), prefix, tokens, ns)
        finally:
            self.tree.unlock(lock)
        return {"length": len(prefix) + len(tokens)}

    def _move(
        self,
        src: torch.Tensor,
        old: torch.Tensor,
        new: torch.Tensor,
        prefix_slots: torch.Tensor,
        prefix: list[int],
        tokens: list[int],
        ns: str | None,
    ) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        dst = self._alloc(src.numel()).to(torch.int64)
        self.sync()
        rotate_copy_layers(self.layers.keys, src, dst, old, new, self.spec, values=self.layers.values)
        rotations = (self.marks[src] - 1).clamp(min=0) + (new != old).to(torch.int32)
        self.marks[dst] = rotations + 1
        value = torch.cat([prefix_slots, dst])
        self.tree.insert(InsertParams(key=_key(prefix + tokens, ns), value=value, prev_prefix_len=len(prefix)))

    # -- construction inside a scheduler ----------------------------------------------------------------
    @classmethod
    def from_scheduler(cls, scheduler: Any) -> SchedulerSplicer:
        """Build the splicer of a running SGLang scheduler (its tree, allocator, pool and model)."""
        from leyline_server.engines.sglang.runtime import scheduler_facts, scheduler_refusals, stream_sync

        allocator = scheduler.token_to_kv_pool_allocator
        layers = kv_layers(allocator.get_kvcache())
        refusals = scheduler_refusals(scheduler)
        if isinstance(layers, str):
            raise RuntimeError(f"Leyline cannot splice this SGLang runtime: {layers}")
        model = scheduler.tp_worker.model_runner.model
        model_type = str(getattr(scheduler.model_config.hf_config, "model_type", "unknown"))
        spec = rope_spec_from_rotary(find_rotary(model), layers.rotary_offset, model_type)
        if (other := first_differing_layer(model)) is not None:
            reason = f"layer {other} rotates unlike layer 0 (sliding-window and global layers): not spliced on SGLang"
            spec = RopeSpec(model_type=model_type, shiftable=False, reason=reason)
        keys = layer0_key_function(model, layers.kind)
        facts = scheduler_facts(scheduler)
        return cls(scheduler.tree_cache, allocator, layers, spec, keys, refusals, facts, stream_sync(scheduler))

"""Sequence-state blobs (``llama_state_seq_get_data``) read and edited in place.

A blob is how llama.cpp serialises one sequence's cells, and the only way it copies cell data.
The layout (this llama.cpp version, one KV stream, flash attention off or on)::

    u32 magic | i32 seq | u32 n_stream = 1 | u32 cells
    cells x (i32 pos | u32 n_seq = 1 | i32 seq)          <- positions, read back as given
    u32 v_trans | u32 n_layer
    n_layer x (i32 k_type | u64 row_bytes | cells x row)  <- keys, one row per cell and layer
    values (rows, or transposed when v_trans)             <- never touched here

:class:`StateBlob` exposes the positions and every layer's key rows as writable numpy views of
the blob, so a repositioning (new positions, keys rotated to them) edits the bytes that
``llama_state_seq_set_data`` then restores into fresh cells. Anything else (another magic,
several streams, a cell shared by several sequences, quantised keys) raises ``ValueError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["KEY_DTYPES", "STATE_MAGIC", "StateBlob", "layer0_keys"]

STATE_MAGIC = 0xAF143CD8  # llama_state_seq_get_data's header (llama.cpp of llama-cpp-python 0.3.36)
KEY_DTYPES: dict[int, type] = {0: np.float32, 1: np.float16, 30: np.uint16}  # ggml type -> storage (bf16 as u16)
_CELL = 12  # i32 pos, u32 n_seq, i32 seq


@dataclass
class StateBlob:
    """A sequence-state blob with writable views of its cells' positions and key rows."""

    data: np.ndarray
    positions: np.ndarray  # int32 [cells], a strided view into ``data``
    keys: list[np.ndarray]  # per layer [cells, row] in the storage dtype (bf16 as uint16)
    k_type: int

    @property
    def cells(self) -> int:
        """How many cells the blob holds."""
        return len(self.positions)

    @classmethod
    def parse(cls, data: np.ndarray) -> StateBlob:
        """Views of ``data`` (a uint8 array, edited in place through them); ``ValueError`` if unknown."""
        try:
            return cls._parse(data)
        except (struct.error, TypeError) as exc:  # shorter than its header says
            raise ValueError(f"a truncated llama.cpp state ({exc})") from exc

    @classmethod
    def _parse(cls, data: np.ndarray) -> StateBlob:
        raw = data.data
        magic, _, streams, cells = struct.unpack_from("<IiII", raw, 0)
        if magic != STATE_MAGIC:
            raise ValueError("unknown llama.cpp state format")
        if streams != 1:
            raise ValueError("more than one KV stream")
        meta = 16
        n_seq = np.ndarray((cells,), dtype="<u4", buffer=data, offset=meta + 4, strides=(_CELL,))
        if cells and not (n_seq == 1).all():
            raise ValueError("a cell with several sequences in a sequence state")
        positions = np.ndarray((cells,), dtype="<i4", buffer=data, offset=meta, strides=(_CELL,))
        off = meta + cells * _CELL
        _, n_layer = struct.unpack_from("<II", raw, off)
        off += 8
        keys: list[np.ndarray] = []
        k_type = -1
        for _ in range(n_layer):
            k_type, row_bytes = struct.unpack_from("<iQ", raw, off)
            off += 12
            if k_type not in KEY_DTYPES:
                raise ValueError(f"key type {k_type} is not f32/f16/bf16")
            dtype = KEY_DTYPES[k_type]
            width = row_bytes // np.dtype(dtype).itemsize
            keys.append(np.ndarray((cells, width), dtype=dtype, buffer=data, offset=off))
            off += cells * row_bytes
        return cls(data, positions, keys, k_type)

    def keys_f32(self, layer: int) -> np.ndarray:
        """A float32 copy of one layer's key rows ``[cells, row]``."""
        rows = self.keys[layer]
        if self.k_type == 30:  # bf16: the upper half of an f32
            return (rows.astype(np.uint32) << 16).view(np.float32)
        return rows.astype(np.float32)


def layer0_keys(blob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, float32 layer-0 key rows) of a sequence-state blob, in cell order (the canary)."""
    state = StateBlob.parse(blob)
    if not state.keys:
        raise ValueError("a state without layers")
    return state.positions.astype(np.int64), state.keys_f32(0)

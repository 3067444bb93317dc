"""Documents' UTF-8 bytes as one virtual byte array, joined only range by range.

The GPU encoder reads its input in ranges of whole (sub-)documents, one per pipelined device
call. Joining each range when its call is uploaded, while the previous call runs on the GPU,
hides the join behind GPU work; one join of the whole batch up front does not overlap with
anything (a large `bytes.join` spends its time mostly faulting in fresh pages).
A range inside one document is a view of that document's bytes, not a copy. A part may also
be an ASCII `str` (its length is its UTF-8 length): it is encoded when its range is joined,
so encoding the batch's text overlaps with GPU work too.
"""

from __future__ import annotations

import numpy as np


def _utf8(part) -> bytes:
    return part if type(part) is bytes else part.encode()


class PackedText:
    """`parts[i]` (bytes, or an ASCII str) occupies bytes [starts[i], starts[i+1]) of the
    virtual array."""

    def __init__(self, parts: list, starts: np.ndarray):
        if len(parts) + 1 != len(starts):
            raise ValueError(f"{len(parts)} parts need {len(parts) + 1} starts, "
                             f"got {len(starts)}")
        self.parts = parts
        self.starts = np.asarray(starts, dtype=np.int64)
        self.size = int(self.starts[-1])

    def __len__(self) -> int:
        return self.size

    def range(self, lo: int, hi: int) -> np.ndarray:
        """Bytes [lo, hi) as a uint8 array (a view when they lie in one part)."""
        if not 0 <= lo <= hi <= self.size:
            raise IndexError(f"range [{lo}, {hi}) outside 0..{self.size}")
        if lo == hi:
            return np.zeros(0, np.uint8)
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        end = int(np.searchsorted(self.starts, hi, side="left"))   # parts first..end-1 cover it
        data = _utf8(self.parts[first]) if end - first == 1 else \
            b"".join(map(_utf8, self.parts[first:end]))
        offset = lo - int(self.starts[first])
        return np.frombuffer(data, np.uint8)[offset:offset + hi - lo]

    def segments(self) -> list[bytes]:
        """Each part's bytes."""
        return list(map(_utf8, self.parts))

    def tobytes(self) -> bytes:
        return b"".join(map(_utf8, self.parts))


class PackedRange:
    """Bytes [lo, hi) of a PackedText, not joined yet: `write_into` puts them into a buffer the
    caller keeps (the GPU encoder's mapped upload buffer), in groups of parts joined GROUP
    bytes at a time. One `bytes.join` of a 16 MB range spends most of its time faulting in
    fresh pages for its result; groups of 256 KB reuse the allocator's memory: 31.6 MB of
    ASCII `str` parts, 40 ms joined vs 7.7 ms written into a reused array on the 2-core dev
    machine (16.8 MB of the bench corpus: 3.5 ms; part by part, 3.7)."""

    GROUP = 256 << 10
    # True: a group of ASCII str parts only is joined as str and encoded once rather than
    # each part encoded and the results joined (a bytes object per part first); a group with
    # a bytes part (an encoded non-ASCII text) is joined as bytes either way (chosen by
    # measurement: dev/tokenizer_throughput/README.md, "Decoder and packed text defaults").
    JOIN_STR_FIRST = True

    def __init__(self, packed: PackedText, lo: int, hi: int):
        if not 0 <= lo <= hi <= packed.size:
            raise IndexError(f"range [{lo}, {hi}) outside 0..{packed.size}")
        self.packed, self.lo, self.hi = packed, lo, hi
        self.size = hi - lo

    def array(self) -> np.ndarray:
        """The bytes joined (a view when they lie in one part)."""
        return self.packed.range(self.lo, self.hi)

    def write_into(self, dst: np.ndarray) -> None:
        """dst[:size] = the bytes (dst: a writable uint8 array of at least `size`), parts
        joined GROUP bytes at a time, on this thread: split over 8 threads, the joins (which
        hold the GIL) made each other wait (dev/tokenizer_throughput/README.md)."""
        starts, parts, lo, hi = self.packed.starts, self.packed.parts, self.lo, self.hi
        if lo == hi:
            return
        i = int(np.searchsorted(starts, lo, side="right")) - 1
        end = int(np.searchsorted(starts, hi, side="left"))   # parts i..end-1 cover [lo, hi)
        while i < end:
            j = min(end, max(i + 1, int(np.searchsorted(starts, int(starts[i]) + self.GROUP,
                                                        side="right")) - 1))
            a, b = max(lo, int(starts[i])), min(hi, int(starts[j]))
            joined = _utf8(parts[i]) if j == i + 1 else self._join(parts[i:j])
            off = a - int(starts[i])
            dst[a - lo:b - lo] = np.frombuffer(joined, np.uint8)[off:off + b - a]
            i = j

    @classmethod
    def _join(cls, group: list) -> bytes:
        if cls.JOIN_STR_FIRST:
            try:
                return "".join(group).encode()   # str parts are ASCII (PackedText)
            except TypeError:   # a bytes part among them
                pass
        return b"".join(map(_utf8, group))


def byte_range(data, lo: int, hi: int) -> np.ndarray:
    """Bytes [lo, hi) of a PackedText or a uint8 array."""
    return data.range(lo, hi) if isinstance(data, PackedText) else data[lo:hi]

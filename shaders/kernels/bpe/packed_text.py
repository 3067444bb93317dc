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


class LazyPackedText(PackedText):
    """A PackedText of `str` documents whose byte starts are learnt as a reader reaches them:
    an ASCII text's UTF-8 length is its length, the others are encoded (`encode`, a group at
    a time through C-level maps) only when `reach(position)` needs their starts, so the GPU
    encoder can encode a big batch's text chunk by chunk while the GPU works on the chunks
    before (one `str.encode` pass over all of it first leaves the GPU idle meanwhile).

    `starts[0..known]` are exact and the entries after them the int64 maximum, so the array
    stays sorted: `np.searchsorted(starts, x)` is right for every x <= starts[known]. `size`
    is an upper bound (4 bytes per character of a non-ASCII text) until every start is known,
    then exact. `range(lo, hi)` learns the starts up to `hi` first, `segments` and `tobytes`
    every start (`complete()`).
    `encode(text) -> bytes` must give a text's UTF-8 (a caller with lone surrogates to
    replace passes its own); it is called only for texts that `str.encode` refuses."""

    UNKNOWN = np.iinfo(np.int64).max
    # characters encoded per group at most: a group's bytes per character sizes the next
    # group, so a reach encodes little past its position (~20 us of numpy per group)
    GROUP_CHARS = 1 << 20

    def __init__(self, texts: list, encode=str.encode):
        n = len(texts)
        self.parts = list(texts)
        self._encode = encode
        self._ascii = np.fromiter(map(str.isascii, self.parts), dtype=bool, count=n)
        chars = np.fromiter(map(len, self.parts), dtype=np.int64, count=n)
        self._chars_before = np.zeros(n + 1, np.int64)
        np.cumsum(chars, out=self._chars_before[1:])
        self.starts = np.full(n + 1, self.UNKNOWN, np.int64)
        self.starts[0] = 0
        self.known = 0
        self.size_lower = int(self._chars_before[-1])   # no text has fewer bytes than characters
        self.size = self.size_lower + 3 * int(chars[~self._ascii].sum())

    def reach(self, position: int) -> None:
        """Learn starts until the first one past `position` (or the end) is known: every
        document that starts at or before `position` has its start and its bytes' length."""
        n = len(self.parts)
        while self.known < n and self.starts[self.known] <= position:
            k = self.known
            done_chars = int(self._chars_before[k])
            ratio = max(1.0, int(self.starts[k]) / done_chars) if done_chars else 1.0
            # the documents whose characters fit the room left (at the bytes per character
            # seen so far), at most GROUP_CHARS of them; at least one
            room = min((position - int(self.starts[k])) / ratio, self.GROUP_CHARS)
            j = int(np.searchsorted(self._chars_before, self._chars_before[k] + room,
                                    side="right")) - 1
            j = min(n, max(j, k + 1))
            lengths = np.diff(self._chars_before[k:j + 1])
            wide = (np.flatnonzero(~self._ascii[k:j]) + k).tolist()
            if wide:
                texts = [self.parts[i] for i in wide]
                try:
                    encoded = list(map(str.encode, texts))
                except UnicodeEncodeError:
                    encoded = [self._encode(t) for t in texts]
                for i, data in zip(wide, encoded):
                    self.parts[i] = data
                lengths[np.array(wide) - k] = np.fromiter(map(len, encoded), np.int64,
                                                          len(encoded))
            np.cumsum(lengths, out=self.starts[k + 1:j + 1])
            self.starts[k + 1:j + 1] += self.starts[k]
            self.known = j
        if self.known == n:
            self.size = int(self.starts[n])

    def estimated_size(self) -> int:
        """The bytes of all documents: exact once every start is known, else the known bytes
        plus the other characters at the known bytes per character (within the bounds)."""
        if self.known == len(self.parts):
            return self.size
        known_chars = int(self._chars_before[self.known])
        ratio = int(self.starts[self.known]) / known_chars if known_chars else 1.0
        guess = int(self.starts[self.known]) + \
            int((self.size_lower - known_chars) * max(1.0, ratio))
        return min(max(guess, self.size_lower), self.size)

    def largest_bound(self) -> int:
        """An upper bound of the largest document's UTF-8 bytes."""
        chars = np.diff(self._chars_before)
        return int(np.where(self._ascii, chars, 4 * chars).max(initial=0))

    def complete(self) -> None:
        """Learn every start (`size` is then exact)."""
        self.reach(self.UNKNOWN - 1)

    def range(self, lo: int, hi: int) -> np.ndarray:
        self.reach(hi)
        return super().range(lo, hi)

    def segments(self) -> list[bytes]:
        self.complete()
        return super().segments()

    def tobytes(self) -> bytes:
        self.complete()
        return super().tobytes()


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

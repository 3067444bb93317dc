"""The GPU trainer: byte-level BPE training as WGSL kernels (bpe_train.wgsl).

    result = train(pieces, n_tokens=32000, device=Device())
    result.merges == cpu_reference.train(pieces, 32000).merges     # always (tested)

The contract is merges.py (the readable CPU trainer: tokenizer_svc/training/cpu_reference.py);
the kernels and their data layout are described at the top of bpe_train.wgsl. This module is
the host side:

- upload the unique pieces (two bytes or more) once, count the byte pairs on the device;
- record rounds of merge steps into one submit: a step is two dispatches, merge_select
  (the best pair of each key block, after making the previous merge's new pairs keys) and
  merge_apply (every workgroup finds the best of those itself, then the merge is applied),
  which share one bind group layout: a round sets its bind group once and records a step
  as set_pipeline + dispatch twice (`Recorder.dispatch_sequence`); on software Vulkan also
  a few CONTINUE passes per step (see the work budget in bpe_train.wgsl). No read-back
  inside a round, no indirect dispatch: apply decides on the device whether there is a
  merge to make, so steps recorded past the end do nothing;
- keep two rounds in flight and read only the small state block of the older one (copied to
  a mappable buffer at the end of each round): that drives the progress bar and decisions;
- between rounds, when that state says so: compact the pieces (drop those that became one
  token, so every later step scans fewer positions), or grow the key list and hash table
  (the device pauses itself before a merge whose new pairs might not fit);
- at the end, download the merge list once.

Where the time goes is in `result.details["phases"]` (host seconds: recording, finishing
the command buffer (wgpu-native's encoding), submitting, waiting for the device, between
rounds) and, with `TrainerOptions(profile=True)`, in `details["gpu_profile"]`: GPU
timestamps of select, apply and the CONTINUE passes over a few sampled rounds (those rounds
run one pass per dispatch and wait for their timestamps: left out of the phases, but not of
the wall time, so time a run without the profile). dev/vocab_train_speed/vocab_host_probe.py
measures the recording alone.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import wgpu

from ...engine import Device, fold_grid
from .merges import N_BYTES, Merge, TrainingError, TrainingResult, exhausted, tokens_from_merges

FILE = "bpe_train.wgsl"
WG = 256
SELECT_ITEMS = 1024
APPLY_TILE = 1024  # positions per apply workgroup (bpe_train.wgsl)
N_BYTE_PAIRS = N_BYTES * N_BYTES
NO_CAP = 0xFFFFFFFF

# state[] words and status values: the S_* / ST_* constants of bpe_train.wgsl
S_STATUS, S_MERGES, S_NEXT_ID, S_TARGET, S_NUM_KEYS, S_KEY_CAP, S_N_PIECES, S_N_POSITIONS, \
    S_LIVE, S_DEAD, S_A, S_B, S_N, S_KEY_END, S_CAP, S_ERRORS, S_HASH_MASK, \
    S_COMPACT_PIECES, S_COMPACT_POSITIONS, S_PENDING, S_BUDGET = range(21)
S_WORDS = 32
ST_RUNNING, ST_DONE, ST_EXHAUSTED, ST_PAUSED_KEYS = range(4)
ERRORS = {1: "a pair to subtract was missing from the hash table",
          2: "the hash table was full"}


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


@dataclass
class _PieceSet:
    """The pieces on the device: tokens, piece of each position, (start, len, count), stamps."""

    tokens: object
    piece_of: object
    pieces: object
    stamps: object


@dataclass
class TrainerOptions:
    round_merges: int = 16  # merge steps in the first round; later rounds adapt
    round_seconds: float = 0.02  # wall time a round should take (bounds the steps wasted at the end)
    max_round_merges: int = 512
    compact_below: float = 0.5  # compact when live tokens < this fraction of the positions
    key_room: int | None = None  # initial key capacity beyond the 65,536 byte pairs
    # Loop iterations an invocation may run per pass (None: unlimited on GPUs, 12,000 on
    # software Vulkan, whose llvmpipe stops every invocation's loops at 65,535 iterations).
    work_budget: int | None = None
    # CONTINUE passes per merge step when the budget is limited (at least 1; None: enough for
    # the longest piece at ~8 iterations per position, at most 4; steps that find a piece
    # still pending wait, and their passes finish it)
    continue_passes: int | None = None
    # Time each kernel with GPU timestamps in a few sampled rounds (details["gpu_profile"])
    profile: bool = False
    profile_rounds: int = 6
    # At most this many apply workgroups per merge, each then visiting several tiles of
    # 1024 positions (None: one tile each). Leave it unset on software Vulkan for large
    # corpora: the grid-stride loop is outside the work budget
    find_groups: int | None = None
    # The largest buffer the trainer may use (None: what the device allows); tests scale it
    # down to see the error a corpus too large for the device gets
    buffer_limit: int | None = None


class GpuTrainer:
    def __init__(self, device: Device, pieces: dict, n_tokens: int,
                 max_token_bytes: int | None = None, n_specials: int = 0,
                 options: TrainerOptions | None = None):
        t_init = time.perf_counter()
        # host seconds by phase: init (arrays, uploads, kernels), setup (initial pair counts),
        # then per round recording, finishing, submitting, waiting for the device, deciding
        # the next
        self.phases = {"init": 0.0, "setup": 0.0, "record": 0.0, "finish": 0.0, "submit": 0.0,
                       "wait": 0.0, "between_rounds": 0.0, "download": 0.0}
        self.dev = device
        self.n_tokens = n_tokens
        self.n_merges = n_tokens - N_BYTES
        self.cap = max_token_bytes
        self.n_specials = n_specials
        self.opt = options or TrainerOptions()
        if hasattr(pieces, "trainer_arrays"):  # piece_store.CorpusPieces: no dict made
            flat8, lens, counts = pieces.trainer_arrays()
        else:
            words = [p for p in pieces if len(p) >= 2]
            lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
            counts = np.fromiter(map(pieces.__getitem__, words), dtype=np.uint64,
                                 count=len(words))
            flat8 = np.frombuffer(b"".join(words), dtype=np.uint8)
        self.n_pieces = int(lens.size)
        self.stats = {"rounds": 0, "steps_recorded": 0, "compactions": 0, "key_growths": 0}
        self.profile: dict = {}  # kernel -> [gpu seconds, dispatches]
        self.profiled_rounds = 0
        self.profiled_steps = 0
        if not self.n_pieces:
            return
        self.n_positions = int(lens.sum())
        self.longest = int(lens.max())
        flat = flat8.astype(np.uint32)
        table = np.empty((self.n_pieces, 4), dtype=np.uint32)
        table[:, 0] = np.concatenate([[0], np.cumsum(lens)[:-1]])
        table[:, 1] = lens
        table[:, 2] = (counts & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        table[:, 3] = (counts >> np.uint64(32)).astype(np.uint32)
        piece_of = np.repeat(np.arange(self.n_pieces, dtype=np.uint32), lens)

        # Every per-piece buffer and the pair table's first size are checked before the first
        # allocation (the largest per piece: the resume cursors, 32 bytes).
        self._check_fits("the corpus's unique pieces", self.n_positions * 4)
        self._check_fits("the piece table", self.n_pieces * 16)
        self._check_fits("the rewrite cursors", self.n_pieces * 32)
        room = self.opt.key_room if self.opt.key_room is not None else 4 * n_tokens + 4096
        self._check_fits("the pair table", _next_pow2(2 * (N_BYTE_PAIRS + room)) * 4)
        self.sets = [_PieceSet(tokens=device.upload(flat, "bpe tokens"),
                               piece_of=device.upload(piece_of, "bpe piece_of"),
                               pieces=device.upload(table, "bpe pieces"),
                               stamps=device.zeros(self.n_pieces, np.uint32, "bpe stamps"))]
        self.current = 0
        self.resume = device.zeros((2 * self.n_pieces, 4), np.uint32, "bpe resume cursors")
        self.moved = device.zeros((self.n_pieces, 2), np.uint32, "bpe compaction moves")
        budget = self.opt.work_budget
        if budget is None and device.info.is_software:
            budget = 12_000
        self.budget = NO_CAP if budget is None else max(1, int(budget))
        if self.budget == NO_CAP:
            self.continue_passes = 0
        elif self.opt.continue_passes is not None:
            self.continue_passes = max(1, self.opt.continue_passes)
        else:  # ~8 iterations per position covers the usual lookups; waiting steps do the rest
            self.continue_passes = min(4, max(1, -(-8 * self.longest // self.budget) - 1))

        self._alloc_keys(N_BYTE_PAIRS + room)
        byte_pairs = np.stack([np.arange(N_BYTE_PAIRS) >> 8, np.arange(N_BYTE_PAIRS) & 255],
                              axis=1).astype(np.uint32)
        self.keys.write(byte_pairs)

        codes = 2 * n_tokens + 2  # (x, N) -> 2x, (N, y) -> 2y + 1
        self.step = device.zeros(3 * codes, np.uint32, "bpe step table")
        tok_len = np.zeros(n_tokens, np.uint32)
        tok_len[:N_BYTES] = 1
        self.tok_len = device.upload(tok_len, "bpe token lengths")
        self.merges = device.zeros((self.n_merges, 4), np.uint32, "bpe merges")
        self.seen = device.zeros(S_WORDS, np.uint32, "bpe state as select saw it")
        state = np.zeros(S_WORDS, np.uint32)
        state[S_STATUS] = ST_RUNNING
        state[S_NEXT_ID] = N_BYTES
        state[S_TARGET] = n_tokens
        state[S_NUM_KEYS] = N_BYTE_PAIRS
        state[S_KEY_END] = N_BYTE_PAIRS
        state[S_KEY_CAP] = self.key_cap
        state[S_N_PIECES] = self.n_pieces
        state[S_N_POSITIONS] = self.n_positions
        state[S_LIVE] = self.n_positions
        state[S_CAP] = NO_CAP if max_token_bytes is None else max_token_bytes
        state[S_HASH_MASK] = self.hash_slots - 1
        state[S_BUDGET] = self.budget
        self.state = device.upload(state, "bpe state")
        self._staging_free: list = []
        self.k = {name: device.kernel(FILE, name) for name in
                  ("count_pairs", "rehash", "compact", "compact_tokens", "compact_finish")}
        self.k["select"], self.k["apply"], self.k["continue"] = device.kernels_sharing_layout(
            FILE, ["merge_select", "merge_apply", ("merge_apply", {"CONTINUE": 1})])
        self._bind()
        self.phases["init"] = time.perf_counter() - t_init

    # ---- buffers ---------------------------------------------------------------------------

    def _check_fits(self, what: str, nbytes: int) -> None:
        limit = min(self.dev.limits.get("max-storage-buffer-binding-size", 128 << 20),
                    self.dev.limits.get("max-buffer-size", 256 << 20))
        if self.opt.buffer_limit is not None:
            limit = min(limit, int(self.opt.buffer_limit))
        if nbytes > limit:
            raise TrainingError(
                f"{what} need {nbytes / 2**20:,.1f} MiB in one buffer, more than this device "
                f"allows ({limit / 2**20:,.1f} MiB on {self.dev.name}; {self.n_pieces:,} "
                "unique pieces of two or more bytes); use a GPU with larger buffers, or fewer "
                "unique pieces (less or less varied text)")

    def _alloc_keys(self, key_cap: int) -> None:
        self.key_cap = key_cap
        self.hash_slots = _next_pow2(2 * key_cap)
        self._check_fits("the pair table", self.hash_slots * 4)
        self.select_groups = -(-key_cap // SELECT_ITEMS)  # = partials rows
        self.keys = self.dev.zeros((key_cap, 2), np.uint32, "bpe keys")
        self.counts = self.dev.zeros(2 * key_cap, np.uint32, "bpe pair counts")
        self.slots = self.dev.zeros(self.hash_slots, np.uint32, "bpe hash slots")
        self.partials = self.dev.zeros((-(-key_cap // SELECT_ITEMS), 4), np.uint32,
                                       "bpe partials")

    def _bind(self) -> None:
        """Bind groups for the current buffers (made once; dispatches reuse them)."""
        s = self.sets[self.current]
        resources = [s.piece_of, s.tokens, s.pieces, s.stamps, self.resume, self.keys,
                     self.counts, self.slots, self.step, self.tok_len, self.merges,
                     self.partials, self.seen, self.state]
        self.group = self.k["select"].bind_group(resources)  # binds for all three

    def _other_set(self) -> _PieceSet:
        if len(self.sets) == 1:
            self.sets.append(_PieceSet(
                tokens=self.dev.zeros(self.n_positions, np.uint32, "bpe tokens B"),
                piece_of=self.dev.zeros(self.n_positions, np.uint32, "bpe piece_of B"),
                pieces=self.dev.zeros((self.n_pieces, 4), np.uint32, "bpe pieces B"),
                stamps=self.dev.zeros(self.n_pieces, np.uint32, "bpe stamps B")))
        return self.sets[1 - self.current]

    def _staging(self):
        if self._staging_free:
            return self._staging_free.pop()
        return self.dev.buffer(S_WORDS * 4, label="bpe state read-back",
                               usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def _read_staging(self, staging) -> np.ndarray:
        staging.raw.map_sync(wgpu.MapMode.READ)
        snap = np.frombuffer(staging.raw.read_mapped(), dtype=np.uint32).copy()
        staging.raw.unmap()
        self._staging_free.append(staging)
        return snap

    # ---- recording ----------------------------------------------------------------------------

    def _record_compaction(self, rec, pieces_bound: int, positions_bound: int) -> None:
        src, dst = self.sets[self.current], self._other_set()
        rec.dispatch(self.k["compact"], [src.pieces, dst.pieces, dst.stamps, self.moved,
                                         self.state], max(1, -(-pieces_bound // WG)))
        rec.dispatch(self.k["compact_tokens"], [src.tokens, src.piece_of, src.pieces, self.moved,
                                                self.state, dst.tokens, dst.piece_of],
                     max(1, -(-positions_bound // WG)))
        rec.dispatch(self.k["compact_finish"], [self.state], 1)
        self.current = 1 - self.current
        self._bind()
        self.stats["compactions"] += 1

    def _record_steps(self, rec, steps: int, pieces_bound: int, positions_bound: int) -> None:
        k = self.k
        limit = self.dev.max_workgroups_per_dim
        apply_groups = max(1, -(-positions_bound // APPLY_TILE))
        if self.opt.find_groups:
            apply_groups = min(apply_groups, max(1, int(self.opt.find_groups)))
        step = [(k["select"], fold_grid(self.select_groups, limit), "select"),
                (k["apply"], fold_grid(apply_groups, limit), "apply")]
        step += [(k["continue"], fold_grid(max(1, -(-pieces_bound // WG)), limit),
                  "continue")] * self.continue_passes
        if rec.timing:  # one pass per dispatch, labelled by kernel
            for _ in range(steps):
                for kernel, grid, label in step:
                    rec.dispatch(kernel, self.group, grid, label=label)
        else:  # one bind group for the round; per step set_pipeline + dispatch each
            rec.dispatch_sequence(self.group, [(kernel, grid) for kernel, grid, _ in step]
                                  * steps)
        self.stats["steps_recorded"] += steps

    def _profile_now(self) -> bool:
        """Whether the next round is one of the GPU-timed samples (spread over the run)."""
        if not self.opt.profile or self.profiled_rounds >= self.opt.profile_rounds:
            return False
        r = self.stats["rounds"]
        return r >= 1 and r & (r - 1) == 0  # rounds 1, 2, 4, 8, ...: early and late merges

    def _submit_round(self, steps: int, compact: bool, pieces_bound: int,
                      positions_bound: int, live: int):
        """Record and submit one round (after a compaction, if asked: `live` tokens then are
        the positions the steps scan); returns (staging buffer of its state, steps)."""
        staging = self._staging()
        timed = self._profile_now()
        if timed:  # a timed recording: one pass per dispatch, at most 2048 of them
            steps = min(steps, 2000 // (2 + self.continue_passes) - 4)
        t0 = time.perf_counter()
        rec = self.dev.record("bpe merges", timing=timed)
        if compact:
            self._record_compaction(rec, pieces_bound, positions_bound)
            positions_bound = live
        self._record_steps(rec, steps, pieces_bound, positions_bound)
        rec.copy(self.state, staging, S_WORDS * 4)
        t1 = time.perf_counter()
        if timed:
            rec.submit()  # resolves the timestamps
            t2 = t3 = time.perf_counter()
        else:
            commands = rec.finish()
            t2 = time.perf_counter()
            self.dev.submit(commands)
            t3 = time.perf_counter()
        if timed:
            for label, seconds in rec.gpu_times:
                entry = self.profile.setdefault(label, [0.0, 0])
                entry[0] += seconds
                entry[1] += 1
            self.profiled_rounds += 1
            self.profiled_steps += steps
        else:
            self.phases["record"] += t1 - t0
            self.phases["finish"] += t2 - t1
            self.phases["submit"] += t3 - t2
        self.stats["rounds"] += 1
        return staging, steps

    def _grow_keys(self, snap: np.ndarray) -> None:
        """More room in the key list: copy keys and counts over, rebuild the hash table."""
        used = int(snap[S_NUM_KEYS])
        need = used + 4 * (2 * int(snap[S_NEXT_ID]) + 1)
        old_keys, old_counts = self.keys, self.counts
        old_partials, old_slots = self.partials, self.slots
        self._alloc_keys(max(2 * self.key_cap, need))
        with self.dev.record("bpe grow keys") as rec:
            rec.copy(old_keys, self.keys, old_keys.nbytes)
            rec.copy(old_counts, self.counts, old_counts.nbytes)
        words = np.array([self.key_cap, self.hash_slots - 1], np.uint32)
        self.state.write(words[:1], S_KEY_CAP * 4)
        self.state.write(words[1:], S_HASH_MASK * 4)
        if used > N_BYTE_PAIRS:
            self.dev.run(self.k["rehash"], [self.keys, self.slots, self.state],
                         -(-(used - N_BYTE_PAIRS) // WG))
        self.state.write(np.array([ST_RUNNING], np.uint32), S_STATUS * 4)
        for buf in (old_keys, old_counts, old_partials, old_slots):
            buf.destroy()
        self._bind()
        self.stats["key_growths"] += 1

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, progress=None) -> TrainingResult:
        start = time.perf_counter()
        if not self.n_pieces:
            raise exhausted(N_BYTES, self.n_tokens, self.n_specials, self.cap)
        s = self.sets[0]
        with self.dev.record("bpe count pairs") as rec:
            rec.dispatch(self.k["count_pairs"], [s.tokens, s.piece_of, s.pieces, self.state,
                                                 self.counts], max(1, -(-self.n_positions // WG)))
        self.phases["setup"] += time.perf_counter() - start
        steps = self.opt.round_merges
        inflight: deque = deque()  # (staging, steps) of submitted rounds, oldest first
        snap = np.zeros(S_WORDS, np.uint32)  # the state after the last round read back
        snap[S_LIVE] = self.n_positions
        pieces_bound, positions_bound = self.n_pieces, self.n_positions
        want_compact = False
        last_time = time.perf_counter()
        status = ST_RUNNING
        while True:
            # Keep two rounds in flight. A compaction goes in front of a round only when
            # nothing is in flight and no piece is mid-rewrite (state[S_PENDING] == 0), so
            # the snapshot describes exactly what the compaction will see.
            while status == ST_RUNNING and len(inflight) < 2 and not (want_compact and inflight):
                remaining = self.n_merges - int(snap[S_MERGES]) - sum(r[1] for r in inflight)
                if remaining <= 0 and inflight:
                    break  # enough steps recorded; see how they went first
                compact = want_compact and not snap[S_PENDING]
                want_compact &= not compact
                n = min(steps, remaining) if remaining > 0 else 4
                inflight.append(self._submit_round(n, compact, pieces_bound, positions_bound,
                                                   int(snap[S_LIVE])))
                if compact:
                    positions_bound = min(positions_bound, int(snap[S_LIVE]))
            if not inflight:
                break
            staging, n = inflight.popleft()
            t_wait = time.perf_counter()
            snap = self._read_staging(staging)
            t_read = time.perf_counter()
            self.phases["wait"] += t_read - t_wait
            if snap[S_ERRORS]:
                raise RuntimeError("GPU trainer internal error: " + "; ".join(
                    why for bit, why in ERRORS.items() if snap[S_ERRORS] & bit))
            pieces_bound = min(pieces_bound, int(snap[S_N_PIECES]))
            positions_bound = min(positions_bound, int(snap[S_N_POSITIONS]))
            if progress is not None:
                progress(int(snap[S_MERGES]), N_BYTES + int(snap[S_MERGES]))
            status = int(snap[S_STATUS])
            if status == ST_PAUSED_KEYS:
                while inflight:  # they ran paused (no-ops); drain before touching buffers
                    snap = self._read_staging(inflight.popleft()[0])
                self._grow_keys(snap)
                status = ST_RUNNING
                snap[S_STATUS] = ST_RUNNING
                continue
            if status != ST_RUNNING:
                continue  # drain what is in flight, then leave
            now = time.perf_counter()
            elapsed, last_time = now - last_time, now
            if elapsed > 0:
                steps = int(min(self.opt.max_round_merges,
                                max(4, n * self.opt.round_seconds / elapsed)))
            live, positions = int(snap[S_LIVE]), int(snap[S_N_POSITIONS])
            if positions and live < self.opt.compact_below * positions:
                want_compact = True
            self.phases["between_rounds"] += time.perf_counter() - t_read

        t_end = time.perf_counter()
        final = self.dev.download(self.state)
        done = int(final[S_MERGES])
        if int(final[S_STATUS]) == ST_EXHAUSTED or done < self.n_merges:
            raise exhausted(N_BYTES + done, self.n_tokens, self.n_specials, self.cap)
        raw = self.dev.download(self.merges)
        merges = [Merge(a, b, N_BYTES + i, lo | (hi << 32))  # tolist: Python ints, ~25% faster
                  for i, (a, b, lo, hi) in enumerate(raw[:done].tolist())]
        seconds = time.perf_counter() - start
        self.phases["download"] += time.perf_counter() - t_end
        details = dict(self.stats, merges_per_second=done / seconds if seconds else 0.0,
                       device=self.dev.name, dispatches_per_merge=2 + self.continue_passes,
                       phases={k: round(v, 4) for k, v in self.phases.items()})
        if self.profile:
            details["gpu_profile"] = self._profile_summary()
        return TrainingResult(merges=merges, tokens=tokens_from_merges(merges),
                              pieces=self.n_pieces, seconds=seconds, details=details)

    def _profile_summary(self) -> dict:
        """GPU microseconds per merge step of each kernel, from the sampled rounds."""
        steps = max(1, self.profiled_steps)
        kernels = {label: {"us_per_step": round(1e6 * total / steps, 3),
                           "us_per_dispatch": round(1e6 * total / max(1, count), 3)}
                   for label, (total, count) in self.profile.items()}
        return {"rounds": self.profiled_rounds, "steps": self.profiled_steps,
                "kernels": kernels,
                "us_per_step": round(1e6 * sum(t for t, _ in self.profile.values()) / steps, 3)}


def train(pieces: dict, n_tokens: int, max_token_bytes: int | None = None,
          n_specials: int = 0, device: Device | None = None, progress=None,
          options: TrainerOptions | None = None) -> TrainingResult:
    """Learn merges on the GPU until there are `n_tokens` ordinary tokens (see merges.py)."""
    if device is None:
        from ...engine import default_device
        device = default_device()
    trainer = GpuTrainer(device, pieces, n_tokens, max_token_bytes, n_specials, options)
    return trainer.run(progress)

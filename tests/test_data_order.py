"""Seeded shuffle of the training windows and the held-out document split.

TokenStream: every epoch reads each window once, in an order fixed by (seed, epoch); a
stream rebuilt from a JSON position continues bit for bit, across epoch boundaries. The
job bridge: a shuffled job resumed from its checkpoint recomputes the same batches and
bit-identical losses and weights; held-out documents are never trained on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.model_helpers import tiny_config
from trainer_svc.jobs.bridge import open_run
from trainer_svc.data.stream import DataError, TokenStream, split_documents
from trainer_svc.jobs.queue import JobSpec


def _shards():
    return [np.arange(0, 100, dtype=np.uint32), np.arange(1000, 1007, dtype=np.uint32),
            np.arange(2000, 2050, dtype=np.uint32)]


def _row_starts(stream, rows):
    return [int(stream.next_batch()[0, 0]) for _ in range(rows)]


def test_each_epoch_reads_every_window_once_in_a_seeded_order():
    s = TokenStream(_shards(), batch=1, seq=8, shuffle=True, seed=3)
    assert s.windows == 12 + 6
    in_order = TokenStream(_shards(), batch=1, seq=8)
    expected = sorted(_row_starts(in_order, 18))
    epoch0, epoch1 = _row_starts(s, 18), _row_starts(s, 18)
    assert sorted(epoch0) == expected and sorted(epoch1) == expected
    assert epoch0 != expected and epoch1 != epoch0          # shuffled, a new order per epoch
    assert s.epoch == 1
    again = TokenStream(_shards(), batch=1, seq=8, shuffle=True, seed=3)
    assert _row_starts(again, 18) == epoch0                 # a function of the seed
    other = TokenStream(_shards(), batch=1, seq=8, shuffle=True, seed=4)
    assert _row_starts(other, 18) != epoch0


def test_shuffled_resume_from_json_continues_exactly_across_epochs():
    a = TokenStream(_shards(), batch=4, seq=5, shuffle=True, seed=11)
    for _ in range(8):                       # 32 rows of 29 windows: inside epoch 1
        a.next_batch()
    saved = json.loads(json.dumps(a.position))
    assert saved["seed"] == 11 and saved["epoch"] == 1
    expected = [a.next_batch() for _ in range(12)]           # crosses into epoch 2
    b = TokenStream(_shards(), batch=4, seq=5, position=saved, shuffle=True, seed=999)
    for want in expected:                                    # the position's seed wins
        np.testing.assert_array_equal(b.next_batch(), want)
    with pytest.raises(DataError, match="same shuffle setting"):
        TokenStream(_shards(), batch=4, seq=5, position=saved)


def test_held_out_documents_are_whole_and_never_trained_on():
    eot = 0
    rng = np.random.default_rng(1)
    docs = [np.concatenate([[eot], rng.integers(1, 50, 30) + 100 * i]) for i in range(40)]
    shards = [np.concatenate(docs[:25]).astype(np.uint32),
              np.concatenate(docs[25:]).astype(np.uint32)]
    train, evals = split_documents(shards, eot, 0.1, seed=5, seq=16)
    held = {int(d) for d in np.unique(evals[0][evals[0] != eot] // 100)}
    kept = {int(d) for d in np.unique(train[0][train[0] != eot] // 100)}
    assert held and not held & kept and held | kept == set(range(40))
    assert train[0].size + evals[0].size == sum(s.size for s in shards)
    again = split_documents(shards, eot, 0.1, seed=5, seq=16)
    np.testing.assert_array_equal(again[1][0], evals[0])
    with pytest.raises(DataError, match="too few"):
        split_documents([shards[0][:31]], eot, 0.1, seed=5, seq=16)


def test_a_shuffled_job_resumed_from_its_checkpoint_recomputes_bit_identical_steps(device,
                                                                                   tmp_path):
    rng = np.random.default_rng(12)
    base = np.tile(np.arange(50, 120, dtype=np.uint32), 40)
    shards = [np.where(rng.random(base.size) < 0.1, rng.integers(1, 500, base.size),
                       base).astype(np.uint32)]
    shards[0][::97] = 0                                      # documents end at id 0
    cfg = tiny_config()
    spec = JobSpec(dataset="d", batch=2, seq=32, steps=8, lr=3e-3, warmup=2, eval_every=4,
                   eval_batches=1, precision="fp32", checkpoint_every=4,
                   model_overrides={k: getattr(cfg, k) for k in ("max_seq",)})
    assert spec.shuffle                                       # the documented default

    def run(job_dir):
        return open_run(spec, "job", shards, job_dir, device, n_vocab=500, vocab_hash="ab",
                        eot=0)

    whole = run(tmp_path / "whole")
    losses = [whole.train_step().loss for _ in range(8)]
    evals_whole = whole.evaluate()
    first = run(tmp_path / "crash")
    for _ in range(4):
        first.train_step()
    first.save()
    position = first.position
    del first                                                 # the "crash"
    resumed = run(tmp_path / "crash")
    assert resumed.resumed_from is not None and resumed.position == position
    rest = [resumed.train_step().loss for _ in range(4)]
    assert rest == losses[4:]                                 # bit-identical
    np.testing.assert_array_equal(resumed.trainer.parameters(), whole.trainer.parameters())
    assert resumed.evaluate() == evals_whole

"""The engine's allocation tracker: bytes alive now and the peak (bench/train.py reports the
peak per row of a training step from it)."""

from __future__ import annotations

import gc

import numpy as np

from tests.model_helpers import tiny_config
from trainer_svc.training.trainer import TrainConfig, Trainer


def test_tracker_counts_buffers_until_destroyed_or_collected(device):
    mem = device.memory
    gc.collect()
    base = mem.allocated
    mem.reset_peak()
    a = device.empty(1000, np.float32)           # 4000 bytes
    b = device.upload(np.zeros(10, np.float16))  # 20 bytes
    assert mem.allocated == base + 4020 and mem.peak == base + 4020
    a.destroy()
    a.destroy()                                   # counted once
    assert mem.allocated == base + 20
    del b
    gc.collect()
    assert mem.allocated == base and mem.peak == base + 4020
    mem.reset_peak()
    assert mem.peak == base


def test_a_trainer_frees_what_it_allocated_and_the_fit_check_counts_its_peak(device):
    gc.collect()
    mem = device.memory
    base = mem.allocated
    mem.reset_peak()
    cfg = tiny_config(vocab=512)
    tr = Trainer(cfg, TrainConfig(batch=2, seq=32, precision="fp32", head_chunk_rows=16),
                 device)
    tr.step(np.random.default_rng(0).integers(0, 512, (2, 33), dtype=np.uint32))
    peak = mem.peak - base
    assert peak >= 4 * tr.layout.total * 4 + 16 * 512 * 4
    # the fit check's count of what the model allocates is what the tracker saw
    # (measured: 224.5 vs 222.6 MiB for tiny/gpt2 at 8 x 128, 375 vs 362 MiB for small)
    from trainer_svc.model.plan import memory_needs
    counted = sum(n.nbytes for n in memory_needs(cfg, tr.layout.total, batch=2, seq=32,
                                                grad_accum=1, mixed=False, logits_rows=16))
    assert 0.9 * peak <= counted <= 1.15 * peak, (counted, peak)
    tr.close()
    gc.collect()
    assert mem.allocated - base < 1 << 20      # only shared scratch and cached uniforms stay

"""f16 precision: tensor-core matmuls where the device has them, dynamic loss scaling.

On devices without f16 subgroup matrices (lavapipe) the f16 precision runs the mixed kernels,
so its losses, weights and gradients must equal precision "mixed" exactly: the loss scale is a
power of two, multiplied into the cross-entropy's gradient and divided out by the gradient
statistics. An overflow (forced here by an absurd scale) skips the update, leaves weights and
moments untouched and halves the scale; the scaler's state survives a checkpoint. The
tensor-core kernels themselves are checked by the ladder (matmul_*_sgmat) on GPUs that have
them, and the f16 loss curve against PyTorch's by bench/train_parity.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.model_helpers import random_batches, tiny_config
from trainer_svc.training.checkpoint import CheckpointManager, load_checkpoint
from trainer_svc.model.loss_scale import LossScaler
from trainer_svc.training.trainer import TrainConfig, Trainer

B, T = 2, 32


@pytest.fixture
def f16_device(device):
    if not device.has("shader-f16"):
        pytest.skip(f"{device.name} lacks shader-f16 (f16 precision keeps an f16 mirror)")
    return device


def _config(precision, steps=4):
    return TrainConfig(batch=B, seq=T, steps=steps, lr=3e-3, min_lr=3e-4, warmup=1,
                       weight_decay=0.1, grad_clip=1.0, precision=precision, seed=3)


def test_loss_scaler_policy():
    s = LossScaler(scale=8.0, growth_interval=3)
    assert [s.update(False) for _ in range(2)] == [False, False] and s.scale == 8.0
    assert s.update(False) is False and s.scale == 16.0 and s.good_steps == 0
    assert s.update(True) is True and s.scale == 8.0
    s = LossScaler(scale=1.0)
    assert s.update(True) is False and s.scale == 1.0   # at the floor: divergence, not range
    s = LossScaler(scale=2.0 ** 24, growth_interval=1)
    s.update(False)
    assert s.scale == 2.0 ** 24                          # capped
    assert LossScaler.from_state(LossScaler(64.0, 5, 2).state()) == LossScaler(64.0, 5, 2)
    with pytest.raises(ValueError, match="loss scale"):
        LossScaler(scale=0.5)


def _run(device, precision, batches):
    trainer = Trainer(tiny_config(), _config(precision), device)
    metrics = [trainer.step(b) for b in batches]
    return trainer, metrics


def test_f16_without_tensor_cores_equals_mixed(f16_device):
    from istanbul.shaders.kernels.matmul import ops as linear
    if linear.has_tensor_cores(f16_device):
        pytest.skip("this device has tensor cores: f16 rounds activations, unlike mixed")
    batches = random_batches(np.random.default_rng(5), 4, B, T, tiny_config().vocab_size)
    mixed, m_mixed = _run(f16_device, "mixed", batches)
    f16, m_f16 = _run(f16_device, "f16", batches)
    assert [m.loss for m in m_f16] == [m.loss for m in m_mixed]
    assert [m.grad_norm for m in m_f16] == pytest.approx([m.grad_norm for m in m_mixed],
                                                         rel=1e-6)
    assert all(m.loss_scale == 2.0 ** 16 and not m.skipped for m in m_f16)
    assert np.array_equal(f16.parameters(), mixed.parameters())
    # gradients come back unscaled
    loss_a, g_a = mixed.loss_and_gradients(batches[0])
    loss_b, g_b = f16.loss_and_gradients(batches[0])
    assert loss_a == loss_b
    for name in g_a:
        np.testing.assert_allclose(g_b[name], g_a[name], rtol=1e-6, atol=1e-12)


def test_an_overflow_skips_the_update_and_halves_the_scale(f16_device):
    batches = random_batches(np.random.default_rng(6), 3, B, T, tiny_config().vocab_size)
    trainer = Trainer(tiny_config(), _config("f16"), f16_device)
    trainer.step(batches[0])
    before, (m0, v0) = trainer.parameters(), trainer._live_model().get_moments()
    trainer._live_model().scaler.scale = 2.0 ** 126   # the squared gradients overflow f32
    m = trainer.step(batches[1])
    assert m.skipped and m.scale_backoff and m.loss_scale == 2.0 ** 126
    assert np.isfinite(m.loss)
    assert trainer._live_model().loss_scale == 2.0 ** 125
    assert np.array_equal(trainer.parameters(), before)
    m1, v1 = trainer._live_model().get_moments()
    assert np.array_equal(m1, m0) and np.array_equal(v1, v0)
    assert trainer.step_count == 1 and trainer.skipped_steps == 0 and trainer.scale_backoffs == 1
    trainer._live_model().scaler.scale = 2.0 ** 10     # a sane scale again: the step happens
    m = trainer.step(batches[1])
    assert not m.skipped and trainer.step_count == 2
    assert not np.array_equal(trainer.parameters(), before)


def test_the_loss_scale_survives_a_checkpoint(f16_device, tmp_path):
    batches = random_batches(np.random.default_rng(7), 4, B, T, tiny_config().vocab_size)
    trainer = Trainer(tiny_config(), _config("f16"), f16_device)
    trainer.step(batches[0])
    trainer._live_model().scaler = LossScaler(scale=1024.0, growth_interval=5, good_steps=3)
    trainer.step(batches[1])
    mgr = CheckpointManager(tmp_path / "run")
    mgr.save(trainer)
    resumed, _ = load_checkpoint(mgr.latest_valid(), f16_device)
    assert resumed.loss_scale_state() == {"scale": 1024.0, "growth_interval": 5,
                                          "good_steps": 4}
    for b in batches[2:]:
        a, r = trainer.step(b), resumed.step(b)
        assert a.loss == r.loss and a.loss_scale == r.loss_scale
    assert np.array_equal(trainer.parameters(), resumed.parameters())


def test_f16_copies_on_tensor_cores_change_no_result(f16_device, monkeypatch):
    """On tensor cores, f16 precision keeps h, h2, s and the attention's head-major q, k, v in
    f16. The matmuls round h, h2, s to f16 themselves (the same clamp and rounding), so with
    them in f32 (GpuModel's f16_activations=False) every loss and weight must come out the same,
    bit for bit. (The f16 q, k, v change q's rounding: the attention's own ladder rungs and
    bench/train_parity.py check those.) Runs where the device has tensor cores (the H200)."""
    from istanbul.shaders.kernels.matmul import ops as linear
    if not linear.has_tensor_cores(f16_device):
        pytest.skip(f"{f16_device.name} has no tensor cores: f16 keeps f32 activations there")
    import functools
    from trainer_svc.training import trainer as training
    from trainer_svc.model.gpu import GpuModel
    batches = random_batches(np.random.default_rng(8), 3, B, T, tiny_config().vocab_size)
    monkeypatch.setattr(training, "GpuModel", functools.partial(GpuModel, f16_activations=False))
    ref, m_ref = _run(f16_device, "f16", batches)
    assert not ref._live_model().step_plan.f16_acts
    monkeypatch.setattr(training, "GpuModel", GpuModel)
    got, m_got = _run(f16_device, "f16", batches)
    model = got._live_model()
    assert model.step_plan.f16_acts and model.step_plan.f16_heads
    assert model.storage[0].h.dtype == np.float16 and model.storage[0].heads.q.dtype == np.float16
    assert [m.loss for m in m_got] == [m.loss for m in m_ref]
    assert np.array_equal(got.parameters(), ref.parameters())


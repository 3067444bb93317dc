"""The chunked LM head + cross-entropy (trainer_svc/model/lm_head.py) and the fit check.

Against a float64 numpy reference on the real device: losses, dh and dW for chunkings
where the rows are not a multiple of the chunk, the vocabulary is not a multiple of the
chunk or of any matmul tile, the ignore index sits in the last chunk, and chunks of one row;
the whole model with chunked heads against the unchunked one and PyTorch; tiny with a
gpt2-sized vocabulary at the default batch on lavapipe (whose logits exceed one binding).
"""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.cross_entropy.ops import IGNORE
from tests.model_helpers import random_batches, tiny_config
from tests.torch_reference import TorchReference
from trainer_svc.model import ModelConfig
from trainer_svc.model.lm_head import ChunkedHead
from trainer_svc.model.plan import ConfigDoesNotFitError, plan_chunk_rows
from trainer_svc.training.trainer import TrainConfig, Trainer


def _reference(h, w, targets, scale):
    x, W = h.astype(np.float64), w.astype(np.float64)
    logits = x @ W.T
    m = logits.max(1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(1, keepdims=True)))[:, 0]
    valid = targets != IGNORE
    rows = np.arange(len(targets))
    loss = np.where(valid, lse - logits[rows, np.where(valid, targets, 0)], 0.0)
    g = np.exp(logits - lse[:, None])
    g[rows[valid], targets[valid]] -= 1.0
    g = np.where(valid[:, None], g * scale, 0.0)
    return loss, g @ W, g.T @ x


def _run_head(device, h, w, targets, chunk, scale, with_grad=True):
    rows, d = h.shape
    vocab = w.shape[0]
    head = ChunkedHead(device, rows, d, vocab, chunk_rows=chunk)
    hb, wb = device.upload(h), device.upload(w)
    tb, lb = device.upload(targets.astype(np.uint32)), device.empty(rows)
    dh, dw = device.empty((rows, d)), device.upload(np.full(w.shape, 0.5, np.float32))
    grads = {"dh": dh, "dw": dw} if with_grad else {}
    with device.record("head") as rec:
        head.record(rec, hb, wb, tb, lb, grad_scale=scale, **grads)
    out = [device.download(lb)]
    if with_grad:
        out += [device.download(dh), device.download(dw) - 0.5]  # dW accumulates
    return head, out


@pytest.mark.parametrize("rows, vocab, chunk", [
    (37, 1000, 8),      # rows not a multiple of the chunk, vocab not a multiple of 4 / tiles
    (37, 1000, 1),      # one-row chunks
    (64, 384, 64),      # one chunk: the unchunked computation
    (20, 130, 7),       # chunk not a multiple of anything
])
def test_chunked_head_matches_the_reference(device, rows, vocab, chunk):
    rng = np.random.default_rng(rows + vocab + chunk)
    d = 64
    h = rng.standard_normal((rows, d)).astype(np.float32)
    w = (rng.standard_normal((vocab, d)) * 0.2).astype(np.float32)
    targets = rng.integers(0, vocab, rows).astype(np.uint32)
    targets[-1] = IGNORE                        # the ignore index in the last chunk
    targets[rows // 2] = IGNORE
    scale = 1.0 / rows
    head, (loss, dh, dw) = _run_head(device, h, w, targets, chunk, scale)
    assert head.chunks == -(-rows // chunk)
    ref_loss, ref_dh, ref_dw = _reference(h, w, targets, scale)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5, atol=2e-5)
    assert loss[-1] == 0.0 and not dh[-1].any()  # ignored: no loss, no gradient
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=1e-6)
    # loss only (evaluation): the same losses, nothing else touched
    _, (loss_only,) = _run_head(device, h, w, targets, chunk, scale, with_grad=False)
    np.testing.assert_array_equal(loss_only, loss)


def test_chunk_rows_follow_the_device_limits(device):
    limit = int(device.limits["max-storage-buffer-binding-size"])
    vocab, rows = 50304, 8192
    c = plan_chunk_rows(device, rows, 768, vocab)
    assert c * vocab * 4 <= limit and c % 64 == 0
    chunks = -(-rows // c)
    assert chunks * c - rows < 64 * chunks          # balanced: no tiny last chunk
    assert plan_chunk_rows(device, 1024, 64, 512) == 1024   # everything fits: one chunk
    assert plan_chunk_rows(device, rows, 768, vocab, budget=64 * vocab * 4) == 64
    align = int(device.limits["min-storage-buffer-offset-alignment"]) // 4
    if align > 1:   # d = 3: a chunk's row view starts aligned only every `align` rows
        with pytest.raises(ValueError, match=f"multiple of {align} rows"):
            plan_chunk_rows(device, 100, 3, 512, chunk_rows=align + 1)
    with pytest.raises(ConfigDoesNotFitError, match="one binding"):
        plan_chunk_rows(device, 100, 64, limit // 4 + 128)


@pytest.mark.parametrize("chunk, precision", [(1, "fp32"), (24, "fp32"), (24, "mixed")])
def test_model_with_a_chunked_head_matches_unchunked_and_pytorch(device, chunk, precision):
    if precision == "mixed" and not device.has("shader-f16"):
        pytest.skip(f"{device.name} lacks shader-f16")
    cfg = tiny_config(vocab=384)
    B, T = 2, 32
    micro = np.stack(random_batches(np.random.default_rng(5), 1, B, T, cfg.vocab_size))
    tc = TrainConfig(batch=B, seq=T, precision=precision)
    whole = Trainer(cfg, tc, device)
    assert whole.model.head.chunks == 1
    loss, grads = whole.loss_and_gradients(micro)
    chunked = Trainer(cfg, TrainConfig(**{**tc.to_dict(), "head_chunk_rows": chunk}), device,
                      parameters=whole.parameters())
    assert chunked.model.head.chunks == -(-B * T // chunk)
    c_loss, c_grads = chunked.loss_and_gradients(micro)
    assert c_loss == pytest.approx(loss, rel=1e-6)
    for name, g in grads.items():
        np.testing.assert_allclose(c_grads[name], g, rtol=1e-4,
                                   atol=1e-6 * float(np.abs(g).max()) + 1e-9, err_msg=name)
    if precision == "fp32":   # (mixed against PyTorch: tests/test_model_parity.py)
        ref_loss, ref_grads = TorchReference(cfg, whole.export_weights()).loss_and_grads(
            micro[0])
        assert c_loss == pytest.approx(ref_loss, rel=1e-5)
        head = ref_grads["head"]
        assert np.linalg.norm(c_grads["head"] - head) / np.linalg.norm(head) < 2e-4
    assert chunked.evaluate(micro[0]) == pytest.approx(whole.evaluate(micro[0]), rel=1e-6)
    whole.close()
    chunked.close()


def test_tiny_with_a_gpt2_vocabulary_trains_at_the_default_batch(device):
    """50,257 ids x 8 x 128 rows: 196 MiB of logits, over lavapipe's 128 MiB binding."""
    cfg = ModelConfig.preset("tiny", 50257)
    tc = TrainConfig(steps=2, lr=3e-3, warmup=0)           # the default batch 8 x 128
    limit = int(device.limits["max-storage-buffer-binding-size"])
    with Trainer(cfg, tc, device) as trainer:
        assert (trainer.model.head.chunks > 1) == (tc.batch * tc.seq * cfg.vocab_size * 4 >
                                                   limit)
        rng = np.random.default_rng(0)
        batch = rng.integers(0, 300, size=(tc.batch, tc.seq + 1), dtype=np.uint32)
        losses = [trainer.step(batch).loss for _ in range(2)]
    assert losses[0] == pytest.approx(np.log(50257), rel=0.05)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def _assume_device_memory(monkeypatch, nbytes: int) -> None:
    """Trainers built from here on get GpuModel(device_memory=nbytes)."""
    import functools
    from trainer_svc.training import trainer as training
    from trainer_svc.model.gpu import GpuModel
    monkeypatch.setattr(training, "GpuModel", functools.partial(GpuModel, device_memory=nbytes))


def test_configurations_that_cannot_fit_are_refused_before_allocating(device, monkeypatch):
    cfg = ModelConfig.preset("tiny", 512)
    limit = int(device.limits["max-storage-buffer-binding-size"])
    rows = limit // (2 * cfg.ffn_hidden * 4) + 1          # FFN activations over one binding
    with pytest.raises(ConfigDoesNotFitError, match=r"gate\|up .* smaller batch"):
        Trainer(cfg, TrainConfig(batch=rows // 64 + 1, seq=64), device)
    _assume_device_memory(monkeypatch, 8 << 20)
    with pytest.raises(ConfigDoesNotFitError, match=r"needs about .* which has 8 MiB"):
        Trainer(cfg, TrainConfig(batch=8, seq=128), device)


def test_the_chunk_shrinks_to_the_memory_the_rest_leaves_free(device, monkeypatch):
    from trainer_svc.model import ParameterLayout
    from trainer_svc.model.plan import HEADROOM, memory_needs
    cfg = tiny_config(vocab=8192)
    total = ParameterLayout.for_config(cfg).total
    rest = sum(n.nbytes * n.count for n in memory_needs(cfg, total, batch=2, seq=32,
                                                       grad_accum=1, mixed=False,
                                                       logits_rows=0))
    free = 20 * 8192 * 4                                      # room for 20 rows of logits
    _assume_device_memory(monkeypatch, int((rest + free) * HEADROOM))
    with Trainer(cfg, TrainConfig(batch=2, seq=32, precision="fp32"), device) as tr:
        assert tr.model.head.chunks > 1 and tr.model.head.chunk * 8192 * 4 <= free
        loss = tr.step(random_batches(np.random.default_rng(2), 1, 2, 32, 8192)[0]).loss
    assert loss == pytest.approx(np.log(8192), rel=0.05)


@pytest.mark.parametrize("vocab", [50304, 200019])
def test_the_124m_step_fits_the_h200_by_its_real_limits(vocab):
    # the H200's limits under wgpu-native (bench/results/h200/devices.json): each saved
    # activation is its own buffer per layer, so 12 layers at 8 x 1024 fit although their
    # sum (4.6 GB) is more than one 4 GiB buffer (a false refusal found on the H200)
    from types import SimpleNamespace
    from trainer_svc.model import ParameterLayout
    from trainer_svc.model.plan import check_fits, memory_needs
    h200 = SimpleNamespace(name="NVIDIA H200", info=None, limits={
        "max-storage-buffer-binding-size": 2147483644, "max-buffer-size": 4292870144,
        "min-storage-buffer-offset-alignment": 256})
    cfg = ModelConfig.preset("124m", vocab)
    total = ParameterLayout.for_config(cfg).total
    chunk = plan_chunk_rows(h200, 8 * 1024, cfg.d_model, cfg.vocab_size)
    needs = memory_needs(cfg, total, batch=8, seq=1024, grad_accum=1, mixed=False,
                         logits_rows=chunk)
    h200_memory = 143771 << 20
    assert check_fits(h200, needs, hint="-", memory=h200_memory) < 40 * 2**30
    assert (chunk == 8 * 1024) == (vocab == 50304)      # o200k: the head in several chunks
    with pytest.raises(ConfigDoesNotFitError, match="needs .* in one binding"):
        check_fits(h200, memory_needs(cfg, total, batch=8 * 40, seq=1024, grad_accum=1,
                                      mixed=False, logits_rows=chunk), hint="-",
                   memory=h200_memory)

"""Resume: a run interrupted at step N continues the uninterrupted run's loss curve exactly.

Tolerance: losses within 1e-6 absolute (the step is deterministic: same kernels, same data
order, same optimizer state, so in practice they are bit-identical); same batches.
"""

import numpy as np

from tests.model_helpers import tiny_config
from trainer_svc.training.checkpoint import CheckpointManager, load_checkpoint
from trainer_svc.data.stream import TokenStream
from trainer_svc.training.trainer import TrainConfig, Trainer




def _shards():
    rng = np.random.default_rng(12)
    # a learnable stream: a repeating pattern with noise
    base = np.tile(np.arange(50, 120, dtype=np.uint32), 40)
    noise = rng.integers(0, 512, size=base.size).astype(np.uint32)
    mix = np.where(rng.random(base.size) < 0.1, noise, base)
    return [mix[:1500], mix[1500:]]


def test_interrupted_run_continues_the_loss_curve(device, tmp_path):
    cfg = tiny_config()
    tc = TrainConfig(batch=2, seq=32, steps=10, lr=3e-3, min_lr=3e-4, warmup=2,
                     grad_accum=2, precision="mixed" if device.has("shader-f16") else "fp32")
    full = Trainer(cfg, tc, device)
    stream = TokenStream(_shards(), tc.batch, tc.seq)
    whole, batches = [], []
    for _ in range(tc.steps):
        b = stream.next_accumulated(tc.grad_accum)
        batches.append(b)
        whole.append(full.step(b).loss)

    first = Trainer(cfg, tc, device)
    stream = TokenStream(_shards(), tc.batch, tc.seq)
    for _ in range(4):
        first.step(stream.next_accumulated(tc.grad_accum))
    mgr = CheckpointManager(tmp_path / "run")
    mgr.save(first, {"data_position": stream.position})
    del first, stream  # the "crash"

    resumed, state = load_checkpoint(mgr.latest_valid(), device)
    assert resumed.step_count == 4
    stream = TokenStream(_shards(), tc.batch, tc.seq, position=state["data_position"])
    rest = []
    for i in range(4, tc.steps):
        b = stream.next_accumulated(tc.grad_accum)
        np.testing.assert_array_equal(b, batches[i])  # same data order
        m = resumed.step(b)
        assert m.step == i + 1
        rest.append(m.loss)
    np.testing.assert_allclose(rest, whole[4:], atol=1e-6)
    assert whole[-1] < whole[0]
    np.testing.assert_allclose(resumed.parameters(), full.parameters(), atol=1e-6)

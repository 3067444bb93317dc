"""bench/train.py's speed anchor, the model as a PyTorch user writes it
(bench/torch_user_model.py), is the same model as istanbul's: same parameter count, same
loss from the same initial weights as the parity reference, and its training step learns."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.torch_user_model import UserModel, make_step  # noqa: E402
from tests.torch_reference import TorchReference  # noqa: E402
from trainer_svc.model.config import ModelConfig  # noqa: E402
from trainer_svc.model.init import init_parameters  # noqa: E402
from trainer_svc.model.layout import ParameterLayout  # noqa: E402


@pytest.mark.parametrize("overrides", [{}, {"tied_head": True}, {"n_kv_heads": 4}])
def test_the_user_model_is_istanbuls_model(overrides):
    cfg = ModelConfig.preset("tiny", 300, **overrides)
    layout = ParameterLayout.for_config(cfg)
    params = layout.unpack(init_parameters(cfg, layout, 3))
    model = UserModel(cfg)
    model.load_layout(params)
    assert sum(p.numel() for p in model.parameters()) == sum(v.size for v in params.values())
    batch = torch.as_tensor(np.random.default_rng(0).integers(0, 300, (2, 33)))
    with torch.no_grad():
        ours = float(model(batch[:, :-1], batch[:, 1:]))
    assert ours == pytest.approx(float(TorchReference(cfg, params).loss(batch)), abs=2e-6)
    step = make_step(model, lr=3e-3, autocast=None)
    losses = [step(batch) for _ in range(5)]
    assert losses[-1] < losses[0] - 0.1

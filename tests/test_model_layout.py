"""Model config presets, the one-buffer parameter layout, its hash, and seeded init."""

import json

import numpy as np
import pytest

from trainer_svc.model import ModelConfig, ParameterLayout, PRESETS
from trainer_svc.model.init import init_parameters
from trainer_svc.model.layout import fnv1a64


def test_presets_pad_vocab_and_round_trip_json():
    for name in PRESETS:
        cfg = ModelConfig.preset(name, 50257)
        assert cfg.vocab_size == 50304
        assert ModelConfig.from_json(cfg.to_json()) == cfg
        assert json.loads(cfg.to_json())["d_model"] == cfg.d_model
    big = ModelConfig.preset("124m", 50257)
    assert (big.d_model, big.n_layers, big.n_heads, big.max_seq) == (768, 12, 12, 1024)
    assert 120e6 < big.n_params() < 130e6


def test_config_rejects_bad_values_with_reasons():
    with pytest.raises(ValueError, match="multiple of 128"):
        ModelConfig(vocab_size=500, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2,
                    ffn_hidden=128, max_seq=32)
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig.preset("tiny", 512, n_kv_heads=3)
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelConfig.preset("huge", 512)
    with pytest.raises(ValueError, match="unknown model config field"):
        ModelConfig.from_dict({**ModelConfig.preset("tiny", 512).to_dict(), "bogus": 1})


def test_layout_is_aligned_disjoint_and_grouped():
    for tied in (False, True):
        cfg = ModelConfig.preset("tiny", 1000, tied_head=tied)
        layout = ParameterLayout.for_config(cfg)
        assert ("head" in layout) is (not tied)
        assert sum(t.size for t in layout) == cfg.n_params()
        prev_end = 0
        for t in layout:
            assert t.offset % 128 == 0 and t.offset >= prev_end  # 256 B in f16, 512 B in f32
            prev_end = t.end
        assert layout.total >= prev_end and layout.total % 128 == 0
        d0, d1 = layout.decay_range()
        n0, n1 = layout.no_decay_range()
        assert d0 == 0 and d1 == n0 and n1 == layout.total
        assert all(t.decay == (t.offset < d1) for t in layout)
        assert all(not t.decay for t in layout if t.name.endswith("norm"))


def test_layout_hash_is_fnv1a_and_sensitive_to_every_field():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C  # published FNV-1a 64 test vector
    base = ParameterLayout.for_config(ModelConfig.preset("tiny", 512))
    assert base.hash == ParameterLayout.for_config(ModelConfig.preset("tiny", 512)).hash
    for vocab, change in ((640, {}), (512, dict(n_layers=3)), (512, dict(tied_head=True)),
                          (512, dict(n_kv_heads=4)), (512, dict(ffn_hidden=256))):
        other = ModelConfig.preset("tiny", vocab, **change)
        assert ParameterLayout.for_config(other).hash != base.hash, change


def test_pack_unpack_round_trip_and_errors():
    layout = ParameterLayout.for_config(ModelConfig.preset("tiny", 256))
    flat = np.random.default_rng(0).standard_normal(layout.total).astype(np.float32)
    named = layout.unpack(flat)
    again = layout.pack(named)
    for t in layout:
        np.testing.assert_array_equal(again[t.offset:t.end], flat[t.offset:t.end])
    with pytest.raises(ValueError, match="missing"):
        layout.pack({k: v for k, v in named.items() if k != "embed"})
    named["final_norm"] = np.zeros(3)
    with pytest.raises(ValueError, match="final_norm"):
        layout.pack(named)


def test_init_is_seeded_and_leaves_gaps_zero():
    cfg = ModelConfig.preset("tiny", 512)
    layout = ParameterLayout.for_config(cfg)
    a, b = init_parameters(cfg, layout, 7), init_parameters(cfg, layout, 7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, init_parameters(cfg, layout, 8))
    covered = np.zeros(layout.total, bool)
    for t in layout:
        covered[t.offset:t.end] = True
    assert not a[~covered].any()
    named = layout.unpack(a)
    assert np.all(named["final_norm"] == 1.0)
    assert abs(named["embed"].std() - 0.02) < 0.002
    assert named["layers.0.wo"].std() < 0.6 * named["layers.0.wq"].std()

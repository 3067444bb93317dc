"""`istanbul export CHECKPOINT --hf DIR`: transformers loads the folder, logits match.

Runs when `transformers` is importable (it is a test dependency; skipped with that reason
otherwise). Tolerance: logits within 1e-4 absolute of the PyTorch reference and of the GPU
forward pass (fp32 weights, random ids).
"""

import json

import numpy as np
import pytest

from istanbul.cli import main
from tests.model_helpers import byte_vocabulary, tiny_config
from tests.torch_reference import TorchReference
from trainer_svc.training.checkpoint import CheckpointManager
from trainer_svc.training.trainer import TrainConfig, Trainer

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install transformers; CPU "
                           "torch suffices)")


def _scaled_trainer(device, tied):
    tr = Trainer(tiny_config(tied_head=tied), TrainConfig(batch=2, seq=16, precision="fp32",
                                                          seed=9), device)
    params = tr.parameters() * 8.0  # larger weights: logits that differ visibly per id
    for t in tr.layout:
        if not t.decay:
            params[t.offset:t.end] = np.linspace(0.5, 1.5, t.size)
    tr.model.set_parameters(params)
    return tr


@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_with_the_same_logits(device, tmp_path, tied):
    import torch
    tr = _scaled_trainer(device, tied)
    vocab = byte_vocabulary(tmp_path / "v.tiktoken", extra=40)
    ckpt = CheckpointManager(tmp_path / "run").save(tr, {}, vocab_file=vocab)
    out = tmp_path / "hf"
    assert main(["export", str(ckpt), "--hf", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is tied

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model.eval()
    ids = np.random.default_rng(1).integers(0, 296, size=(2, 24))
    with torch.no_grad():
        hf_logits = model(torch.as_tensor(ids)).logits.numpy()
    ref_logits = TorchReference(tr.model_config, tr.export_weights()).logits(ids)
    assert np.abs(hf_logits - ref_logits).max() < 1e-4
    assert hf_logits.std() > 0.1

    from trainer_svc.model.generate import Generator
    gen = Generator(tr.model_config, tr.parameters(), device)
    gpu_last = gen.prefill(ids[0])
    assert np.abs(gpu_last - hf_logits[0, -1]).max() < 1e-4

    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    from trainer_svc.data.text import load_codec
    codec = load_codec(vocab)
    text = "def tokenize(stream):\n    return [t for t in stream if t]  # héllo\n"
    assert tok.encode(text, add_special_tokens=False) == codec.encode(text)
    assert tok.decode(codec.encode(text)) == text


def test_export_refuses_a_bad_checkpoint(device, tmp_path, capsys):
    tr = _scaled_trainer(device, False)
    ckpt = CheckpointManager(tmp_path / "run").save(tr, {})
    (ckpt / "MANIFEST.json").unlink()
    assert main(["export", str(ckpt), "--hf", str(tmp_path / "hf")]) == 1
    assert "manifest missing" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()

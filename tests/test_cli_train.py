"""`istanbul train`, `istanbul generate`, `istanbul export` end to end on tiny data."""

import os
import re

import numpy as np
import pytest

from istanbul.cli import main
from tests.model_helpers import byte_vocabulary, stdlib_text
from trainer_svc.data.shards import encode_shard
from trainer_svc.data.text import load_codec




@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    vocab = byte_vocabulary(root / "letters.tiktoken", extra=100)
    text = root / "stdlib.py"
    text.write_text(stdlib_text(30_000), encoding="utf-8")
    return vocab, text


def test_train_checkpoint_resume_generate(corpus, tmp_path, capsys):
    vocab, text = corpus
    run = tmp_path / "run"
    common = ["train", "--text", str(text), "--vocab", str(vocab), "--model", "tiny",
              "--batch", "2", "--seq", "32", "--lr", "3e-3", "--log-every", "5",
              "--checkpoints", str(run), "--checkpoint-every", "10"]
    assert main(common + ["--steps", "20"]) == 0
    out = capsys.readouterr().out
    losses = [float(x) for x in re.findall(r"loss=([0-9.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("step_")) == \
        ["step_00000010", "step_00000020"]
    assert os.readlink(run / "latest") == "step_00000020"

    assert main(common + ["--steps", "30", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "step_00000020" in out
    assert re.search(r"step 30/30 loss=", out)
    assert os.readlink(run / "latest") == "step_00000030"

    assert main(["generate", "--checkpoint", str(run / "latest"), "--prompt", "def ",
                 "--max-tokens", "12", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def ") and len(out) > len("def \n")

    assert main(["generate", "--checkpoint", str(run), "--prompt", "import", "--ids",
                 "--max-tokens", "5", "--temperature", "0.8", "--top-k", "20", "--seed",
                 "3"]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == len(load_codec(vocab).encode("import")) + 5


def test_train_from_a_shard_file(corpus, tmp_path, capsys):
    vocab, text = corpus
    codec = load_codec(vocab)
    ids = codec.encode(text.read_text(encoding="utf-8"))
    shard = tmp_path / "data.shard"
    shard.write_bytes(encode_shard(np.asarray(ids), codec.content_hash, codec.n_vocab))
    assert main(["train", "--data", str(shard), "--vocab", str(vocab), "--model", "tiny",
                 "--steps", "3", "--batch", "2", "--seq", "16", "--log-every", "1"]) == 0
    assert len(re.findall(r"loss=", capsys.readouterr().out)) == 3
    # without --vocab the model's vocabulary comes from the largest id in the shards
    assert main(["train", "--data", str(shard), "--model", "tiny", "--steps", "1", "--batch",
                 "1", "--seq", "8", "--precision", "fp32"]) == 0
    assert "loss=" in capsys.readouterr().out


def test_bad_inputs_exit_non_zero_with_clear_errors(corpus, tmp_path, capsys):
    vocab, text = corpus
    assert main(["train", "--text", str(text), "--model", "tiny", "--steps", "1"]) == 1
    assert "--text needs --vocab" in capsys.readouterr().err
    assert main(["train", "--text", str(tmp_path / "missing.txt"), "--vocab", str(vocab),
                 "--steps", "1"]) == 1
    assert "missing.txt" in capsys.readouterr().err
    other = byte_vocabulary(tmp_path / "other.tiktoken", extra=5, name="other")
    shard = tmp_path / "x.shard"
    shard.write_bytes(encode_shard(np.arange(100), load_codec(other).content_hash, 300))
    assert main(["train", "--data", str(shard), "--vocab", str(vocab), "--steps", "1"]) == 1
    assert "another vocabulary" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(tmp_path / "nope"), "--prompt", "x"]) == 1
    assert "no such checkpoint" in capsys.readouterr().err


def test_bad_checkpoints_stop_generate_and_resume(corpus, tmp_path, capsys):
    vocab, text = corpus
    run = tmp_path / "run"
    args = ["train", "--text", str(text), "--vocab", str(vocab), "--model", "tiny",
            "--batch", "2", "--seq", "16", "--checkpoints", str(run)]
    assert main(args + ["--steps", "2"]) == 0
    step = run / "step_00000002"
    blob = bytearray((step / "model.safetensors").read_bytes())
    blob[-7] ^= 0x40
    (step / "model.safetensors").write_bytes(bytes(blob))
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(step), "--prompt", "x"]) == 1
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "sha256" in err
    assert main(args + ["--steps", "4", "--resume"]) == 1
    assert "passes verification" in capsys.readouterr().err
    assert (step / "model.safetensors").read_bytes() == bytes(blob)  # nothing overwritten

"""`istanbul vocab train` end to end: the file loads in tiktoken, tiktoken and istanbul's
encoder agree on held-out text, and bad input fails clearly without leaving output behind."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken

from istanbul.cli import main
from tokenizer_svc.patterns import PATTERNS
from tokenizer_svc.vocab import load_vocabulary

STDLIB = Path(random.__file__).parent
TRAIN_FILES = [STDLIB / "textwrap.py", STDLIB / "shlex.py", STDLIB / "json" / "decoder.py"]
HELD_OUT = ((STDLIB / "json" / "encoder.py").read_text(encoding="utf-8")
            + "\nÜnïcödé: İstanbul'da güzel bir gün 😀 — «quotes»\r\n\t  \n123456789 'll 've\n"
            + " " * 40 + "x" * 300)


def train(tmp_path, *extra, files=TRAIN_FILES, out="v.tiktoken"):
    """Run the CLI in this process; (exit code, output path)."""
    path = tmp_path / out
    code = main(["vocab", "train", *map(str, files), "-o", str(path), "--no-progress",
                 "--workers", "1", *extra])
    return code, path


def tiktoken_encoding(path: Path) -> tiktoken.Encoding:
    vocab = load_vocabulary(path)
    return tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                             special_tokens=vocab.special_tokens)


@pytest.mark.parametrize("pattern", ["gpt2", "o200k"])
def test_trained_file_loads_in_tiktoken_and_agrees_with_istanbul(device, tmp_path, pattern):
    from tokenizer_svc.encoding import get_encoding
    code, path = train(tmp_path, "--size", "700", "--pattern", pattern,
                       "--special", "<|endoftext|>", "--special", "<|pad|>")
    assert code == 0
    vocab = load_vocabulary(path)
    assert vocab.pattern == PATTERNS[pattern] and vocab.pattern_name == pattern
    assert vocab.special_tokens == {"<|endoftext|>": 698, "<|pad|>": 699}
    assert sorted(vocab.ranks.values()) == list(range(698))
    assert all(vocab.ranks[bytes([b])] == b for b in range(256))

    tk = tiktoken_encoding(path)
    assert tk.n_vocab == 700
    text = HELD_OUT + "<|endoftext|>" + HELD_OUT[:500] + "<|pad|>"
    want = tk.encode(text, allowed_special="all")
    assert tk.decode(want) == text
    ours = get_encoding(path, device=device)
    assert ours.encode(text, allowed_special="all") == want
    assert ours.encode_ordinary(HELD_OUT) == tk.encode_ordinary(HELD_OUT)
    assert want[-1] == 699 and 698 in want
    assert len(tk.encode_ordinary(HELD_OUT)) < len(HELD_OUT.encode()) / 2  # it compresses


def test_custom_regex_cap_and_cpu_trainer_give_the_same_file(tmp_path):
    regex = r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"
    common = ["--size", "500", "--pattern", regex, "--max-token-bytes", "6"]
    code_gpu, gpu = train(tmp_path, *common, out="gpu.tiktoken")
    code_cpu, cpu = train(tmp_path, *common, "--trainer", "cpu", out="cpu.tiktoken")
    assert code_gpu == code_cpu == 0
    assert gpu.read_bytes() == cpu.read_bytes()
    vocab = load_vocabulary(gpu)
    assert vocab.pattern == regex and vocab.pattern_name is None
    assert max(len(t) for t in vocab.ranks) <= 6
    tk = tiktoken_encoding(gpu)
    assert tk.decode(tk.encode(HELD_OUT)) == HELD_OUT


def test_invalid_utf8_keep_puts_raw_bytes_in_tokens(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(("café déjà vu à la mode, naïve façade, crème brûlée, señor, Größe "
                        "für Ästhetik, où est-ce? " * 100).encode("latin-1"))
    code, path = train(tmp_path, "--size", "290", "--pattern", "gpt2", "--invalid-utf8", "keep",
                       files=[corpus])
    assert code == 0
    ranks = load_vocabulary(path).ranks
    assert b" \xe0" in ranks  # " à" in latin-1: a space and a byte that is not UTF-8


def expect_failure(capsys, tmp_path, path: Path, *needles: str):
    err = capsys.readouterr().err
    assert err.startswith("istanbul vocab: error:"), err
    for needle in needles:
        assert needle in err, err
    assert not path.exists() and not Path(str(path) + ".json").exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_inputs_fail_clearly_and_write_nothing(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    one_char = tmp_path / "aaaa.txt"
    one_char.write_text("a" * 5000)
    singles = tmp_path / "singles.txt"
    singles.write_text("a\nb\nc\n" * 100)
    bad_utf8 = tmp_path / "bad.txt"
    bad_utf8.write_bytes(b"fine text\n" * 10 + b"\xc3\x28 broken")
    (tmp_path / "none").mkdir()
    cases = [
        (["--size", "256"], TRAIN_FILES, ["--size 256", "at least 257"]),
        (["--size", "257", "--special", "<s>"], TRAIN_FILES, ["at least 258"]),
        (["--size", "1000"], [empty], ["corpus is empty"]),
        (["--size", "1000"], [one_char], ["ran out of pairs", "at most 272"]),
        (["--size", "1000", "--pattern", "cl100k"], [singles], ["no piece of two or more bytes"]),
        (["--size", "300"], [bad_utf8], ["bad.txt: invalid UTF-8 at byte 100",
                                         "--invalid-utf8 keep"]),
        (["--size", "300"], [tmp_path / "nope.txt"], ["nope.txt: no such file"]),
        (["--size", "300"], [tmp_path / "none"], ["none: no files in this directory"]),
        (["--size", "300", "--pattern", "([bad"], TRAIN_FILES, ["neither a known pattern"]),
        (["--size", "300", "--max-token-bytes", "1"], TRAIN_FILES, ["allows no merge"]),
    ]
    for extra, files, needles in cases:
        code, path = train(tmp_path, *extra, files=files)
        assert code == 1, (extra, files)
        expect_failure(capsys, tmp_path, path, *needles, "no output written"
                       if "--size 256" not in needles[0] else "")


def test_output_problems_are_caught_before_training(tmp_path, capsys):
    code = main(["vocab", "train", str(TRAIN_FILES[0]), "--size", "300", "--no-progress",
                 "-o", str(tmp_path / "missing" / "v.tiktoken")])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err
    code = main(["vocab", "train", str(TRAIN_FILES[0]), "--size", "300", "--no-progress",
                 "-o", str(TRAIN_FILES[0])])
    assert code == 1
    assert "would overwrite the input file" in capsys.readouterr().err


def test_help_lists_the_options():
    out = subprocess.run([sys.executable, "-m", "istanbul", "vocab", "train", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--size", "--pattern", "--special", "--max-token-bytes", "--invalid-utf8",
                 "--trainer", "--workers", "-o", "--adapter"):
        assert flag in out
    assert "gpt2, r50k, cl100k, o200k" in out


def test_argument_errors_come_before_any_device(tmp_path, capsys, monkeypatch):
    """A bad argument is refused before a GPU device is created (1.2 s on lavapipe, more where
    the driver is slow to start): the device factory is replaced by one that records and
    refuses, and must not be reached."""
    from istanbul.shaders import engine
    opened = []

    def no_device(*args, **kwargs):
        opened.append(args)
        raise AssertionError("a GPU device was requested")

    monkeypatch.setattr(engine.Device, "__init__", no_device)
    monkeypatch.setattr(engine, "default_device", no_device)
    good = [str(f) for f in TRAIN_FILES]
    out = tmp_path / "v.tiktoken"
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "empty"), "--size", "300"], ["no files in this directory",
                                                      str(tmp_path / "empty")]),
        ([*good, str(tmp_path / "*.nothing"), "--size", "300"], ["no file matches"]),
        ([*good, str(tmp_path / "nope.txt"), "--size", "300"], ["nope.txt: no such file"]),
        ([*good, "--size", "256"], ["--size 256", "at least 257"]),
        ([*good, "--size", "300", "--special", "<s>", "--special", "<s>"], ["given twice"]),
        ([*good, "--size", "300", "--max-token-bytes", "1"], ["--max-token-bytes 1"]),
        ([*good, "--size", "300", "--pattern", "([bad"], ["--pattern", "neither a known"]),
        ([*good, "--size", "300", "--pattern", r"\w+", "--pretokenizer", "gpu"],
         ["--pretokenizer gpu needs one of the GPU patterns"]),
        ([*good, "--size", "300", "--workers", "0"], ["--workers 0"]),
    ]
    for argv, needles in cases:
        for trainer in ("gpu", "cpu"):
            code = main(["vocab", "train", *argv, "--trainer", trainer, "-o", str(out),
                         "--no-progress"])
            err = capsys.readouterr().err
            assert code == 1 and err.startswith("istanbul vocab: error:"), (argv, err)
            for needle in needles:
                assert needle in err, (argv, err)
            assert not out.exists()
    code = main(["vocab", "train", *good, "--size", "300", "-o",
                 str(tmp_path / "missing" / "v.tiktoken")])
    assert code == 1 and "does not exist" in capsys.readouterr().err
    assert opened == []
    # and the check above does see a device being asked for: good arguments get that far
    with pytest.raises(AssertionError, match="a GPU device was requested"):
        main(["vocab", "train", *good, "--size", "300", "-o", str(out), "--no-progress"])
    assert len(opened) == 1


def test_argument_checks_import_no_gpu_module(tmp_path):
    """check_arguments alone (what `vocab train` runs first) loads neither wgpu nor the engine."""
    code = f"""
import argparse, sys
from istanbul_errors import UserFacingError
from tokenizer_svc.cli_vocab import check_arguments
args = argparse.Namespace(output={str(tmp_path / "v.tiktoken")!r}, files=[{str(tmp_path)!r}],
                          size=300, special=[], max_token_bytes=None, pattern="o200k",
                          pretokenizer="auto", workers=None, format="auto", text_field=None,
                          skip_bad=False)
try:
    check_arguments(args)
except UserFacingError as exc:
    print(exc)
print(sorted(m for m in ("wgpu", "istanbul.shaders.engine",
                        "istanbul.shaders.kernels.bpe.encode") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert "no files in this directory" in done.stdout, done
    assert done.stdout.splitlines()[-1] == "[]", done

"""Single pre-tokens of half a megabyte and more: exact ids, bounded time, no endless resume.

Before the fix a resumed pre-tokenizer segment searched every following chunk for its end
before matching anything; from about 511,616 bytes (3,997 chunks of 128 bytes, llvmpipe's
work budget of 4,000) that search alone ate the budget, and the driver resumed forever.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenizer_svc.encoding import get_encoding
from istanbul.shaders.kernels.bpe.encode import EncoderStalled, GpuEncoder

from .tokenizer_support import tiktoken_twin, vocabulary_for

EDGE = 511_616
MB = 1_000_000


@pytest.fixture(scope="module")
def pair(device):
    vocab = vocabulary_for("trained-gpt2")
    return get_encoding(vocab, device=device), tiktoken_twin(vocab)


def _word_run(n: int) -> str:
    """One letter piece of n bytes that BPE merges (a trained word repeated, no spaces)."""
    return ("tokenizer" * (n // 9 + 1))[:n]


def _check(enc, tik, docs):
    ids, offsets = enc.encode_batch_flat(docs)
    for n, doc in enumerate(docs):
        assert ids[offsets[n]:offsets[n + 1]].tolist() == tik.encode_ordinary(doc), \
            f"document {n}: {doc[:12]!r} x {len(doc)}"


@pytest.mark.timeout(600)
def test_single_pieces_around_the_budget_edge(pair):
    enc, tik = pair
    _check(enc, tik, ["x" * (EDGE - 1), "x" * EDGE, "x" * (EDGE + 1)])


@pytest.mark.timeout(600)
def test_single_pieces_of_one_megabyte(pair):
    enc, tik = pair
    _check(enc, tik, [_word_run(MB),              # letters that merge
                      " " * MB,                   # one whitespace piece
                      "7" * MB,                   # digits (one piece with this pattern)
                      "日本語" * (MB // 9)])       # CJK without spaces: one letter piece


@pytest.mark.timeout(600)
def test_one_megabyte_of_random_bytes_in_bytes_mode(pair):
    enc, tik = pair
    data = random.Random(18).randbytes(MB)
    assert enc.encode_bytes(data) == tik._encode_bytes(data)


@pytest.mark.timeout(120)
def test_a_resume_without_progress_is_an_internal_error_not_a_hang(pair, device):
    enc, _ = pair
    if not device.info.is_software:
        pytest.skip("the work budget (and so resuming) exists only on software Vulkan")
    stuck = GpuEncoder(device, enc.backend.tables, "gpt2")
    stuck.long_budget = 0        # a long-merge dispatch that can take no step at all
    stuck.budget = 0
    data = _word_run(70_000).encode()
    with pytest.raises(EncoderStalled, match="70,000 input bytes"):
        stuck.encode_docs(data, np.array([0, len(data)]))


def test_interrupt_check_stops_a_long_piece_between_rounds(pair, device):
    enc, _ = pair
    if not device.info.is_software:
        pytest.skip("on a GPU a long piece is one dispatch; there is no round to stop between")
    encoder = GpuEncoder(device, enc.backend.tables, "gpt2")
    calls = []

    def check():
        calls.append(1)
        if len(calls) > 3:
            raise TimeoutError("deadline")

    data = _word_run(200_000).encode()
    with pytest.raises(TimeoutError), encoder.interruptible(check):
        encoder.encode_docs(data, np.array([0, len(data)]))
    # the encoder is usable afterwards (its lock was released, its state is per call)
    ids, _ = encoder.encode_docs(b"tokenizer tokenizer", np.array([0, 19]))
    assert ids.tolist() == enc.encode_ordinary("tokenizer tokenizer")


def test_one_encoder_called_from_several_threads(pair, device):
    """GpuEncoder serialises its calls (one lock per encoder: a call owns its buffer pool and
    counters), so threads sharing one get their own, exact, results."""
    import threading
    enc, tik = pair
    encoder = GpuEncoder(device, enc.backend.tables, "gpt2")
    docs = [_word_run(3000 + 500 * k) + f" doc {k} " + "7" * (k + 1) for k in range(6)]
    got, errors = {}, []

    def work(k):
        try:
            data = docs[k].encode()
            for _ in range(3):
                ids, _ = encoder.encode_docs(data, np.array([0, len(data)]))
                got.setdefault(k, []).append(ids.tolist())
        except Exception as exc:   # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(docs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for k, doc in enumerate(docs):
        assert got[k] == [tik.encode_ordinary(doc)] * 3

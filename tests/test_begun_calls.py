"""Encode calls in two halves (GpuEncoder.begin_docs, GpuBackend.begin_packed,
Encoding._begin_utf8_batch_flat): submitted, then finished later, two in flight on an encoder
and its twin. What the shared GPU process relies on to overlap a round's GPU time with its
other work: every call's ids exact whatever the order of begins and finishes, the slow path
inside a begun call, errors that give the encoder back, other threads' calls waiting.
Trained vocabularies (no shared files needed); ids against tiktoken with the same ranks.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from tokenizer_svc.encoding import Encoding
from istanbul.shaders.kernels.bpe.encode import EXACT_GUESS_BYTES

from .tokenizer_support import MULTILINGUAL, TRICKY, tiktoken_twin, vocabulary_for


@pytest.fixture(scope="module", params=["trained-cl100k", "trained-gpt2"])
def fresh(request, device):
    """An Encoding of its own (get_encoding's are shared across tests) and tiktoken's twin."""
    vocab = vocabulary_for(request.param)
    return Encoding(vocab, device), tiktoken_twin(vocab)


def _batches(seed: int, n: int) -> list[list[str]]:
    rng = random.Random(seed)
    pool = list(TRICKY) + list(MULTILINGUAL) + ["", "word " * 50, "日本語のテキスト" * 30]
    return [[rng.choice(pool) + str(k) for k in range(rng.randrange(1, 9))] for _ in range(n)]


def _utf8(docs: list[str]) -> list[bytes]:
    return [d.encode() for d in docs]


def _check(result, docs, tik) -> None:
    ids, offsets = result
    assert offsets.size == len(docs) + 1 and int(offsets[-1]) == ids.size
    got = [np.asarray(ids[offsets[i]:offsets[i + 1]]).tolist() for i in range(len(docs))]
    assert got == [tik.encode_ordinary(d) for d in docs]


def test_two_calls_in_flight_each_get_their_own_ids(fresh):
    """Begin N + 1 before finishing N, for a run of batches (the GPU process's pattern), and
    also both begun before either finishes in the other order: the second runs on the twin."""
    enc, tik = fresh
    batches = _batches(3, 12)
    pending = None
    for docs in batches:
        call = enc._begin_utf8_batch_flat(_utf8(docs))
        if pending is not None:
            _check(pending[0].finish(), pending[1], tik)
        pending = (call, docs)
    _check(pending[0].finish(), pending[1], tik)
    first = enc._begin_utf8_batch_flat(_utf8(batches[0]))
    second = enc._begin_utf8_batch_flat(_utf8(batches[1]))
    assert first.encoder is not second.encoder            # the twin took the second
    _check(second.finish(), batches[1], tik)
    _check(first.finish(), batches[0], tik)
    _check(enc.encode_batch_flat(batches[2]), batches[2], tik)   # the plain path after them


def test_a_begun_call_on_its_slow_path_beside_one_in_flight(fresh):
    """The first call's ids guess is far too small (its finish takes the slow path: more
    submits, after the second call's); both stay exact."""
    enc, tik = fresh
    docs_a = ["日本語のテキスト" * 60, "hello world " * 40]
    docs_b = ["second call " * 30, "x"]
    primary = enc.backend.encoder
    primary.exact_guess_bytes = 0
    primary.ids_per_byte = primary.first_ids_per_byte = 0.0
    primary.profile = True
    try:
        a = enc._begin_utf8_batch_flat(_utf8(docs_a))
        b = enc._begin_utf8_batch_flat(_utf8(docs_b))
        _check(a.finish(), docs_a, tik)
        _check(b.finish(), docs_b, tik)
        assert primary.last_profile.slow_paths >= 1
    finally:
        primary.exact_guess_bytes = EXACT_GUESS_BYTES
        primary.profile = False


def test_a_call_of_several_chunks_runs_whole_at_begin(fresh):
    enc, tik = fresh
    primary = enc.backend.encoder
    saved = primary.pipeline_bytes
    primary.pipeline_bytes = 400          # chunks of 100, 200, 400 bytes
    try:
        docs = [f"document {k} " * 20 for k in range(12)]
        call = enc._begin_utf8_batch_flat(_utf8(docs))
        _check(call.finish(), docs, tik)
    finally:
        primary.pipeline_bytes = saved


@pytest.mark.parametrize("docs", [[], [""], ["", "", ""]])
def test_calls_without_text(fresh, docs):
    enc, tik = fresh
    _check(enc._begin_utf8_batch_flat(_utf8(docs)).finish(), docs, tik)


def test_finish_once_cancel_gives_the_encoder_back(fresh):
    enc, tik = fresh
    docs = ["a call that is dropped", "and its neighbour"]
    call = enc._begin_utf8_batch_flat(_utf8(docs))
    call.cancel()
    call.cancel()                          # a second cancel does nothing
    again = enc._begin_utf8_batch_flat(_utf8(docs))
    assert again.encoder is enc.backend.encoder   # the primary is free again
    _check(again.finish(), docs, tik)
    with pytest.raises(RuntimeError, match="already finished"):
        again.finish()


def test_a_failing_submit_gives_the_encoder_back(fresh, monkeypatch):
    enc, tik = fresh
    primary = enc.backend.encoder

    def broken(rec, chunk):
        raise RuntimeError("simulated device error")
    monkeypatch.setattr(primary, "_record_compact", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        enc._begin_utf8_batch_flat(_utf8(["boom"]))
    monkeypatch.undo()
    assert not primary._lock.locked()
    _check(enc._begin_utf8_batch_flat(_utf8(["fine"])).finish(), ["fine"], tik)


def test_another_threads_call_waits_for_the_begun_one(fresh):
    """A begun call holds its encoder: another thread's plain call on the same Encoding
    waits until it is finished, then gets its own ids (nothing of the begun call's)."""
    enc, tik = fresh
    docs = ["the begun call's text " * 10]
    other = ["the other thread's text " * 7, "日本"]
    call = enc._begin_utf8_batch_flat(_utf8(docs))
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", enc.encode_batch_flat(other)))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()               # waiting for the begun call's encoder
    _check(call.finish(), docs, tik)
    thread.join(30)
    _check(out["r"], other, tik)


def test_a_cpu_encoding_finishes_at_begin():
    vocab = vocabulary_for("trained-gpt2")
    enc, tik = Encoding(vocab, "cpu"), tiktoken_twin(vocab)
    docs = ["plain text", "日本語"]
    call = enc._begin_utf8_batch_flat(_utf8(docs))
    assert call.encoder is None
    ids, offsets = call.finish()
    _check((np.asarray(ids), offsets), docs, tik)


def test_a_begin_waits_for_another_threads_call_never_its_own(fresh):
    """The primary encoder held by another thread's plain call, every other one by this
    thread's begun calls: a new begin waits for the other thread (which ends its call on
    its own) instead of for an encoder only this thread could give back."""
    from tokenizer_svc.gpu_backend import MAX_TWINS
    enc, tik = fresh
    backend = enc.backend
    docs = [["held by us " * 5]] * (MAX_TWINS + 1)
    ours = [enc._begin_utf8_batch_flat(_utf8(d)) for d in docs]     # every encoder, once
    assert len({id(c.encoder) for c in ours}) == MAX_TWINS + 1
    with pytest.raises(RuntimeError, match="finish one before beginning another"):
        enc._begin_utf8_batch_flat(_utf8(["one too many"]))
    _check(ours[0].finish(), docs[0], tik)                         # the primary is free
    taken, release = threading.Event(), threading.Event()

    def plain_call_in_progress():
        with backend.encoder._lock:
            backend.encoder.holder = threading.get_ident()
            taken.set()
            release.wait(30)
            backend.encoder.holder = None
    other = threading.Thread(target=plain_call_in_progress)
    other.start()
    taken.wait(30)
    threading.Timer(0.3, release.set).start()
    new = ["begun while the other thread holds the primary"]
    call = enc._begin_utf8_batch_flat(_utf8(new))    # waits ~0.3 s for the other thread
    assert call.encoder is backend.encoder
    _check(call.finish(), new, tik)
    other.join(30)
    for c, d in zip(ours[1:], docs[1:]):
        _check(c.finish(), d, tik)

"""The batching core without gRPC: DynamicBatcher forming batches, BatchRunner on the real
Encoding (one call per batch, errors isolated per request, chunking, offsets, truncation)."""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np
import pytest

from tokenizer_svc.service.batcher import DeadlineExpired, DynamicBatcher
from tokenizer_svc.service.errors import RequestRejected
from tokenizer_svc.service.work import BatchRunner, DecodeJob, EncodeJob, SpecialRule
from tests.service_support import TEXTS, tiny_encoding, tiny_vocab_path  # noqa: F401


def _rule(encoding, **policy) -> SpecialRule:
    return SpecialRule.from_policy(encoding.vocab.special_tokens, **policy)


class CountingRunner(BatchRunner):
    """The real BatchRunner, remembering the jobs of each batch it ran."""

    def __init__(self, encoding, **kwargs):
        super().__init__(encoding, **kwargs)
        self.batches = []

    def __call__(self, jobs):
        self.batches.append(len(jobs))
        return super().__call__(jobs)


def _batcher(runner, executor, **kwargs):
    settings = dict(window_s=0.2, max_items=1000, max_bytes=1 << 20, max_queued_bytes=1 << 30,
                    reject_queue_full=lambda queued, n: RuntimeError("full"), eager=False)
    settings.update(kwargs)
    return DynamicBatcher(runner, executor, **settings)


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture
def executor():
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool


def test_concurrent_submissions_share_one_call_and_get_their_own_results(tiny_encoding,
                                                                          executor):
    runner = CountingRunner(tiny_encoding)
    rule = _rule(tiny_encoding)

    async def main():
        batcher = _batcher(runner, executor)
        batcher.start()
        results = await asyncio.gather(*(
            batcher.submit(EncodeJob([t], rule), items=1, nbytes=len(t.encode()))
            for t in TEXTS))
        await batcher.close()
        return results
    results = _run(main())
    assert runner.batches == [len(TEXTS)]
    for text, [doc] in zip(TEXTS, results):
        assert doc.ids.tolist() == list(tiny_encoding.encode(text))
        assert doc.token_count == len(doc.ids) and not doc.truncated


@pytest.mark.parametrize("limits, expected", [
    (dict(max_items=3), [3, 3, 3, 1]),
    (dict(max_bytes=25), [2, 2, 2, 2, 2]),  # 10 requests of 10-11 bytes
])
def test_batches_close_at_max_items_and_max_bytes(tiny_encoding, executor, limits, expected):
    runner = CountingRunner(tiny_encoding)
    rule = _rule(tiny_encoding)
    texts = [f"text nr {k:2d}" for k in range(10)]

    async def main():
        batcher = _batcher(runner, executor, window_s=0.5, **limits)
        batcher.start()
        out = await asyncio.gather(*(batcher.submit(EncodeJob([t], rule), items=1,
                                                    nbytes=len(t)) for t in texts))
        await batcher.close()
        return out
    out = _run(main())
    assert runner.batches == expected
    assert [doc.ids.tolist() for [doc] in out] == [list(tiny_encoding.encode(t)) for t in texts]


def test_an_oversized_request_runs_alone(tiny_encoding, executor):
    runner = CountingRunner(tiny_encoding)
    rule = _rule(tiny_encoding)

    async def main():
        batcher = _batcher(runner, executor, max_bytes=100)
        batcher.start()
        big = "x" * 500
        await asyncio.gather(batcher.submit(EncodeJob([big], rule), items=1, nbytes=500),
                             batcher.submit(EncodeJob(["small"], rule), items=1, nbytes=5))
        await batcher.close()
    _run(main())
    assert runner.batches == [1, 1]


def test_cancelled_and_expired_requests_leave_the_batch(tiny_encoding, executor):
    runner = CountingRunner(tiny_encoding)
    rule = _rule(tiny_encoding)

    async def main():
        batcher = _batcher(runner, executor, window_s=0.3)
        batcher.start()
        cancelled = asyncio.ensure_future(batcher.submit(EncodeJob(["a"], rule), items=1,
                                                         nbytes=1))
        expired = asyncio.ensure_future(batcher.submit(EncodeJob(["b"], rule), items=1,
                                                       nbytes=1, timeout=0.05))
        kept = asyncio.ensure_future(batcher.submit(EncodeJob(["c"], rule), items=1, nbytes=1))
        await asyncio.sleep(0.1)
        cancelled.cancel()
        [doc] = await kept
        with pytest.raises(DeadlineExpired):
            await expired
        await batcher.close()
        return doc
    doc = _run(main())
    assert doc.ids.tolist() == list(tiny_encoding.encode("c"))
    assert runner.batches == [1]  # only "c" reached the Encoding


def test_one_bad_request_does_not_fail_its_batch(tiny_encoding):
    runner = BatchRunner(tiny_encoding)
    strict, allow_all = _rule(tiny_encoding), _rule(tiny_encoding, allow_all=True)
    good_ids = list(tiny_encoding.encode("fine"))
    results = runner([
        EncodeJob(["fine"], strict),
        EncodeJob(["has <|fim|>"], strict),
        EncodeJob(["has <|fim|>"], allow_all),
        DecodeJob([np.array(good_ids, np.uint32)]),
        DecodeJob([np.array([1, tiny_encoding.n_vocab + 3], np.uint32)]),
    ])
    assert results[0][0].ids.tolist() == good_ids
    assert isinstance(results[1], RequestRejected) and results[1].reason == "disallowed-special"
    assert "<|fim|>" in results[1].message
    assert results[2][0].ids.tolist() == list(tiny_encoding.encode("has <|fim|>",
                                                                    allowed_special="all"))
    assert results[3] == [b"fine"]
    assert isinstance(results[4], RequestRejected) and results[4].reason == "invalid-token"
    assert str(tiny_encoding.n_vocab + 3) in results[4].message
    assert ("istanbul-invalid-token", f"{tiny_encoding.n_vocab + 3},1,0") in \
        results[4].trailing_metadata()


def test_large_requests_are_split_into_bounded_calls(tiny_encoding):
    calls = []

    class Recording:  # the real Encoding, with its encode_batch_flat calls recorded
        def __getattr__(self, name):
            return getattr(tiny_encoding, name)

        def encode_batch_flat(self, docs, **kwargs):
            calls.append((len(docs), sum(len(d.encode()) for d in docs)))
            return tiny_encoding.encode_batch_flat(docs, **kwargs)

    runner = BatchRunner(Recording(), max_call_bytes=100)
    docs = [t * 2 for t in TEXTS]
    [encoded] = runner([EncodeJob(docs, _rule(tiny_encoding))])
    assert len(calls) > 1
    assert all(nbytes <= 100 or count == 1 for count, nbytes in calls), calls
    assert sum(count for count, _ in calls) == len(docs)
    assert [d.ids.tolist() for d in encoded] == [list(tiny_encoding.encode(d)) for d in docs]


def test_truncation_and_offsets_are_applied_per_document(tiny_encoding):
    text = TEXTS[2]
    full = list(tiny_encoding.encode(text))
    _, byte_offsets = tiny_encoding.encode_with_offsets(text, unit="byte")
    runner = BatchRunner(tiny_encoding)
    [[left]] = runner([EncodeJob([text], _rule(tiny_encoding), offsets="byte", max_tokens=3,
                                 keep_end=True)])
    assert left.ids.tolist() == full[-3:] and left.offsets.tolist() == byte_offsets[-3:]
    assert left.truncated and left.token_count == len(full)


@pytest.mark.parametrize("inflight", [1, 2])
def test_max_inflight_batches_run_at_once_and_no_more(tiny_encoding, inflight):
    """A batch function that waits (the shared GPU process's round trip) runs `max_inflight`
    batches at once; the next batch forms while they run and starts when a slot frees."""
    runner = BatchRunner(tiny_encoding)
    rule = _rule(tiny_encoding)
    running, most, lock = [0], [0], __import__("threading").Lock()
    release = __import__("threading").Event()

    def slow(jobs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(30)
        try:
            return runner(jobs)
        finally:
            with lock:
                running[0] -= 1

    async def main():
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            batcher = _batcher(slow, pool, window_s=0.0, max_inflight=inflight)
            batcher.start()
            tasks = []
            for t in TEXTS[:3]:    # one at a time: each may start a batch of its own
                tasks.append(asyncio.ensure_future(batcher.submit(
                    EncodeJob([t], rule), items=1, nbytes=len(t.encode()))))
                for _ in range(100):
                    await asyncio.sleep(0.005)
            started = running[0]
            release.set()
            results = await asyncio.gather(*tasks)
            await batcher.close()
            return started, results, batcher.batches_run
    started, results, batches = _run(main())
    assert started == inflight and most[0] == inflight
    assert [list(r[0].ids) for r in results] == [tiny_encoding.encode(t) for t in TEXTS[:3]]
    # with one slot the two later requests wait together and form one batch
    assert batches == (3 if inflight == 2 else 2)

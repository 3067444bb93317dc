"""The BPE kernels climb the verification ladder (compile, run, exact against references)."""

from __future__ import annotations

import pytest

from shaders.ladder import check_case, load_cases

BPE_CASES = sorted(c.name for c in load_cases().values() if c.family == "bpe")


def test_all_bpe_kernels_are_registered():
    assert {"bpe_encode_gpt2", "bpe_encode_cl100k", "bpe_encode_o200k", "bpe_scan",
            "bpe_decode"} <= set(BPE_CASES)


@pytest.mark.parametrize("name", BPE_CASES)
def test_bpe_kernel_passes_its_rungs(device, name):
    results = check_case(device, load_cases()[name])
    failed = [r.line() for r in results if r.ok is False]
    assert not failed, failed
    assert any(r.rung == "correct" and r.ok for r in results)

"""Every registered kernel case climbs the verification ladder on the real device.

One test per case (`istanbul kernels check` runs the same rungs): compile, run, correct
against its numpy reference, and grad for backward kernels. Ids are `family/case`, so
`pytest -k rmsnorm` runs one family.
"""

from __future__ import annotations

import pytest

from istanbul.shaders.ladder import check_case, load_cases

CASES = load_cases()
# the family folders shaders/kernels/<family>/ (their cases.py and *_cases.py)
FAMILIES = {"elementwise", "embedding", "rmsnorm", "matmul", "rope", "attention",
            "activations", "cross_entropy", "optim", "bpe", "bpe_train"}


def test_every_family_registers_cases():
    found = {c.family for c in CASES.values()}
    assert found == FAMILIES, f"families changed: {sorted(found ^ FAMILIES)}"
    assert {"bpe_encode_gpt2", "bpe_encode_cl100k", "bpe_encode_o200k", "bpe_utf8_check",
            "bpe_scan", "bpe_decode"} <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES, key=lambda n: (CASES[n].family, n)),
                         ids=lambda n: f"{CASES[n].family}/{n}")
def test_case_climbs_the_ladder(device, name):
    results = check_case(device, CASES[name])
    failed = [r.line() for r in results if r.ok is False]
    assert not failed, failed
    missing = [f for f in CASES[name].requires if not device.has(f)]
    if missing:
        pytest.skip(f"device lacks {', '.join(missing)}")
    assert any(r.rung == "correct" and r.ok for r in results), [r.line() for r in results]


@pytest.mark.parametrize("name,cls,method", [
    ("bpe_encode_o200k", "istanbul.shaders.kernels.bpe.encode.GpuEncoder", "encode_docs"),
    ("bpe_decode", "istanbul.shaders.kernels.bpe.decode.GpuDecoder", "decode")])
def test_bpe_cases_run_the_tokenizers_own_entry_point(device, monkeypatch, name, cls, method):
    import importlib
    import numpy as np
    module, _, attr = cls.rpartition(".")
    klass = getattr(importlib.import_module(module), attr)
    real, calls = getattr(klass, method), []

    def spy(self, *args, **kwargs):
        calls.append(method)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(klass, method, spy)
    case = CASES[name]
    launch = case.launch(device, case.inputs(np.random.default_rng(0), "random"))
    with device.record() as rec:
        launch.encode(rec)
    assert calls == [method] and launch.gpu_seconds is not None
    assert launch.gpu_seconds() > 0 or not device.has("timestamp-query")

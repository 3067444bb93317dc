"""Job specs from flags and TOML files, and what can be checked before a job runs."""

from __future__ import annotations

import argparse

import pytest

from istanbul.errors import UserFacingError
from trainer_svc.jobs.bridge import check_spec, model_config_for, spec_fingerprint, train_config_for
from trainer_svc.cli_jobs import build_spec_dict, register
from trainer_svc.jobs.queue import JobInputError, JobSpec


def parse_submit(*argv: str):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["submit", *argv])


def test_toml_spec_with_model_overrides_and_flags_on_top(tmp_path):
    spec_file = tmp_path / "job.toml"
    spec_file.write_text('dataset = "web"\nmodel = "tiny"\nsteps = 100\nlr = 2e-3\n'
                         'checkpoint_every = 10\n[model_overrides]\nn_layers = 3\n')
    data = build_spec_dict(parse_submit("--spec", str(spec_file), "--steps", "7",
                                        "--model-set", "d_model=128", "--model-set",
                                        "tied_head=true"))
    spec = JobSpec.parse(data)
    assert spec.steps == 7 and spec.lr == 2e-3 and spec.checkpoint_every == 10
    assert spec.model_overrides == {"n_layers": 3, "d_model": 128, "tied_head": True}
    cfg = model_config_for(spec, 600)
    assert (cfg.n_layers, cfg.d_model, cfg.tied_head, cfg.vocab_size) == (3, 128, True, 640)
    tc = train_config_for(spec, cfg)
    assert tc.seq == cfg.max_seq and tc.min_lr == pytest.approx(2e-4) and tc.steps == 7


def test_bad_spec_files_and_flags_are_clear(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("dataset = \n")
    with pytest.raises(UserFacingError, match="not valid TOML"):
        build_spec_dict(parse_submit("--spec", str(bad)))
    with pytest.raises(UserFacingError, match="No such file"):
        build_spec_dict(parse_submit("--spec", str(tmp_path / "missing.toml")))
    with pytest.raises(UserFacingError, match="expected FIELD=VALUE"):
        build_spec_dict(parse_submit("--dataset", "d", "--model-set", "d_model"))


def test_checks_that_need_the_vocabulary_size():
    with pytest.raises(JobInputError, match="seq 4096 exceeds the model's max_seq 256"):
        check_spec(JobSpec(dataset="d", steps=3, seq=4096), 600)
    with pytest.raises(JobInputError, match="not divisible by n_heads"):
        check_spec(JobSpec(dataset="d", steps=3, model_overrides={"d_model": 66}), 600)
    check_spec(JobSpec(dataset="d", steps=3, model="124m"), 50257)


def test_fingerprint_ignores_only_what_does_not_change_the_computation():
    base = JobSpec(dataset="d", steps=10)
    assert spec_fingerprint(base) == spec_fingerprint(
        base.model_copy(update={"checkpoint_every": 3, "keep_last": 9, "max_failures": 1}))
    evals = base.model_copy(update={"eval_every": 5})
    assert spec_fingerprint(evals) == spec_fingerprint(evals.model_copy(update={"eval_every": 9}))
    assert spec_fingerprint(base) != spec_fingerprint(evals)       # shards held out
    assert spec_fingerprint(base) != spec_fingerprint(base.model_copy(update={"steps": 11}))
    assert spec_fingerprint(base) != spec_fingerprint(base.model_copy(update={"lr": 0.5}))
    assert spec_fingerprint(base) != spec_fingerprint(base.model_copy(update={"seed": 7}))


@pytest.mark.parametrize("fields,message", [
    ({"eval_every": 1, "eval_batches": 2_000_000}, "eval_batches: Input should be less than or "
                                                   "equal to 65536"),
    ({"eval_every": 1, "eval_batches": 60000, "batch": 16, "seq": 32},
     r"eval_batches x batch x seq = 60000 x 512 held-out tokens is above the limit 16777216; "
     r"lower eval_batches \(at most 32768"),
    ({"batch": 65536, "seq": 1024}, "batch x seq = 65536 x 1024 = 67108864 tokens per "
                                    "micro-batch is above the limit 1048576"),
    ({"batch": 8192}, r"batch x seq = 8192 x 256 = 2097152"),    # seq: the preset's max_seq
    ({"grad_accum": 4096, "batch": 64, "seq": 256}, "grad_accum x batch x seq = 4096 x 16384 "
                                                    "tokens per step is above the limit"),
    ({"model_overrides": {"d_model": 100_000}}, "d_model 100000 is above the limit 16384"),
    ({"model_overrides": {"max_seq": 1 << 21}}, "max_seq 2097152 is above the limit"),
    ({"model": "124m", "model_overrides": {"n_layers": 256, "ffn_hidden": 32768}},
     "parameters even with a tiny vocabulary, above the limit 1,073,741,824"),
    ({"keep_last": 10**6}, "keep_last: Input should be less than or equal to 1000"),
    ({"max_failures": 10**6}, "max_failures: Input should be less than or equal to 1000"),
])
def test_every_field_that_allocates_is_bounded_with_a_clear_error(fields, message):
    with pytest.raises(JobInputError, match=message):
        JobSpec.parse({"dataset": "d", "steps": 3, **fields})


def test_bounds_leave_the_real_configurations_alone():
    JobSpec.parse({"dataset": "d", "steps": 5000, "model": "124m", "batch": 8, "seq": 1024,
                   "grad_accum": 64, "eval_every": 250, "eval_batches": 256})
    JobSpec.parse({"dataset": "d", "steps": 3, "eval_batches": 2_000})   # no eval: unused


def test_the_vocabulary_size_is_bounded_with_the_whole_model():
    from trainer_svc.jobs.queue import MAX_VOCAB, check_vocab_size
    spec = JobSpec(dataset="web", steps=3)
    check_vocab_size(spec, 200_019)
    for bad in (0, MAX_VOCAB + 1, 10**12):
        with pytest.raises(JobInputError, match=f"dataset 'web' declares a vocabulary of {bad}"):
            check_vocab_size(spec, bad)
    big = JobSpec(dataset="web", steps=3, model_overrides={"d_model": 1024})   # untied head
    with pytest.raises(JobInputError, match="with a vocabulary of 1000000 ids has"):
        check_vocab_size(big, 1_000_000)


def test_errors_are_classified_once_deterministic_or_transient():
    from pydantic import BaseModel, ValidationError
    from trainer_svc.jobs.failures import TransientJobError, is_deterministic

    class Model(BaseModel):
        x: int
    try:
        Model(x="no")
    except ValidationError as exc:
        invalid = exc
    assert is_deterministic(JobInputError("bad shard"))
    assert is_deterministic(UserFacingError("the model does not fit the device"))
    assert is_deterministic(invalid)
    wrapped = RuntimeError("while building the model")
    wrapped.__cause__ = UserFacingError("does not fit")
    assert is_deterministic(wrapped)
    assert not is_deterministic(RuntimeError("GPU device lost"))
    assert not is_deterministic(OSError(28, "No space left on device"))
    assert not is_deterministic(TransientJobError("retry me"))
    flaky = TransientJobError("the allocation failed this time")
    flaky.__cause__ = UserFacingError("out of memory")
    assert not is_deterministic(flaky)                  # the explicit word wins

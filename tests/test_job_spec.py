"""Job specs from flags and TOML files, and what can be checked before a job runs."""

from __future__ import annotations

import argparse

import pytest

from istanbul.errors import UserFacingError
from trainer_svc.bridge import check_spec, model_config_for, spec_fingerprint, train_config_for
from trainer_svc.cli_jobs import build_spec_dict, register
from trainer_svc.jobs import JobInputError, JobSpec


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

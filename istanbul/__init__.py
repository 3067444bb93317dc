"""istanbul: a GPU BPE tokenizer and a transformer trainer whose every kernel is WGSL.

The tokenizer has tiktoken's API and gives tiktoken's ids::

    import istanbul
    enc = istanbul.get_encoding("o200k_base")        # on the GPU (software Vulkan without one)
    enc.encode("hello world")                        # [24912, 2375]
    enc.decode(enc.encode("hello world"))            # 'hello world'
    enc.encode("<|endoftext|>", allowed_special="all")
    enc = istanbul.get_encoding("o200k_base", device="cpu")   # the plain-Python reference

The same API over gRPC, from a running `istanbul serve`::

    with istanbul.TokenizerClient("localhost:50051") as enc:
        enc.encode_batch(["one", "two"])

Training and generation on the GPU::

    device = istanbul.Device()                       # or Device("1"), Device("H200")
    config = istanbul.ModelConfig.preset("tiny", enc.n_vocab)
    trainer = istanbul.Trainer(config, istanbul.TrainConfig(batch=8, seq=128), device)
    metrics = trainer.step(batch)                    # (B, T+1) token ids -> loss, grad_norm, ...

Every name is imported on first use, so `import istanbul` is cheap (no GPU, gRPC or numpy)
and the libraries below never import this package back. The kernel house (the folder shaders/)
is `istanbul.shaders`, mapped by the install (pyproject's [tool.setuptools.package-dir]; in a
checkout the editable install, `pip install -e .`); importing it runs only this file's cheap
top, never a lazy name.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"


# public name -> (module, attribute); read by __getattr__ and by the import-cycle test.
LAZY_EXPORTS = {
    "get_encoding": ("tokenizer_svc.encoding", "get_encoding"),
    "Encoding": ("tokenizer_svc.encoding", "Encoding"),
    "encoding_for_model": ("tokenizer_svc.encoding", "encoding_for_model"),
    "encoding_name_for_model": ("tokenizer_svc.encoding", "encoding_name_for_model"),
    "load_vocabulary": ("tokenizer_svc.vocab", "load_vocabulary"),
    "Vocabulary": ("tokenizer_svc.vocab", "Vocabulary"),
    "TokenizerClient": ("tokenizer_svc.service.client", "TokenizerClient"),
    "Device": ("istanbul.shaders.engine", "Device"),
    "ModelConfig": ("trainer_svc.model", "ModelConfig"),
    "TrainConfig": ("trainer_svc.training.trainer", "TrainConfig"),
    "Trainer": ("trainer_svc.training.trainer", "Trainer"),
    "Generator": ("trainer_svc.model.generate", "Generator"),
    "load_checkpoint": ("trainer_svc.training.checkpoint", "load_checkpoint"),
    "UserFacingError": ("istanbul_errors", "UserFacingError"),
}

__all__ = ["__version__", *LAZY_EXPORTS]


def __getattr__(name: str):
    try:
        module, attribute = LAZY_EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'istanbul' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value          # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY_EXPORTS))

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
is `istanbul.shaders`; importing it runs only this file's cheap top, never a lazy name.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

__version__ = "0.1.0"


class CheckoutHouseFinder:
    """`istanbul.shaders` in a checkout run without install (PYTHONPATH=<repo>, or the repo as
    the working directory): the kernel house is the design card's folder <repo>/shaders, beside
    this package, not inside it. An install maps it to the same name (pyproject's
    [tool.setuptools.package-dir]); this finder (a sys.meta_path entry) answers that name only."""

    NAME = "istanbul.shaders"

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.NAME:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(self.folder, "__init__.py"),
            submodule_search_locations=[self.folder])


def _find_the_house_in_a_checkout() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    house = os.path.join(os.path.dirname(here), "shaders")
    if os.path.isdir(os.path.join(here, "shaders")) or not os.path.isfile(
            os.path.join(house, "__init__.py")):
        return                     # installed (istanbul/shaders/ is a real folder) or no checkout
    # first, ahead of an editable install's finder (of maybe another checkout); once, even
    # when this module is reloaded
    sys.meta_path[:] = [f for f in sys.meta_path
                        if type(f).__name__ != CheckoutHouseFinder.__name__]
    sys.meta_path.insert(0, CheckoutHouseFinder(house))


_find_the_house_in_a_checkout()

# public name -> (module, attribute); read by __getattr__ and by the import-cycle test.
LAZY_EXPORTS = {
    "get_encoding": ("tokenizer_svc.encoding", "get_encoding"),
    "Encoding": ("tokenizer_svc.encoding", "Encoding"),
    "encoding_for_model": ("tokenizer_svc.encoding", "encoding_for_model"),
    "encoding_name_for_model": ("tokenizer_svc.encoding", "encoding_name_for_model"),
    "load_vocabulary": ("tokenizer_svc.vocab", "load_vocabulary"),
    "Vocabulary": ("tokenizer_svc.vocab", "Vocabulary"),
    "TokenizerClient": ("tokenizer_svc.client", "TokenizerClient"),
    "Device": ("istanbul.shaders.engine", "Device"),
    "ModelConfig": ("trainer_svc.model", "ModelConfig"),
    "TrainConfig": ("trainer_svc.training", "TrainConfig"),
    "Trainer": ("trainer_svc.training", "Trainer"),
    "Generator": ("trainer_svc.generate", "Generator"),
    "load_checkpoint": ("trainer_svc.checkpoint", "load_checkpoint"),
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

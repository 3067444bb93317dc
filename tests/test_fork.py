"""A forked child's Encoding keeps working (issue 52): exact ids on the CPU, the GPU untouched.

The parent encodes on a real wgpu device (lavapipe on CI); its children are made with `fork`,
the default start method of multiprocessing, DataLoader workers and datasets.map on Linux.
Every child's ids are compared with the parent's GPU ids and with tiktoken / `tokenizers`;
each child must warn once, naming spawn/forkserver; the parent must keep its GPU; and a
child must never call into wgpu, not even to release the parent's objects (a spy on
wgpu's library calls in a child that drops all it holds and collects its garbage).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import traceback
import warnings

import numpy as np
import pytest

from tokenizer_svc import forked
from tokenizer_svc.encoding import Encoding, ForkedGpuWarning
from tokenizer_svc.vocab import load_vocabulary

from .conftest import REPO, SHARED_VOCAB
from .tokenizer_support import MULTILINGUAL, TRICKY, corpus_docs, load_trained, tiktoken_twin

FORK = multiprocessing.get_context("fork")
SPECIAL = "<|endoftext|>"


def documents() -> list[str]:
    """Several hundred documents: code, many scripts, the pre-tokenizer's corners, long
    pieces (runs of letters, digits, spaces, newlines) and special-token text."""
    long_pieces = ["a" * 20_000, "7" * 9_999, " " * 12_000 + "x", "\n" * 5_000 + "y",
                   "Straße" * 3_000, "日本語" * 4_000, "😀" * 2_000, "ab " * 6_000]
    corpus = corpus_docs()
    docs = corpus + [d[len(d) // 3:] for d in corpus] + MULTILINGUAL * 4 + TRICKY + long_pieces
    docs += [f"{SPECIAL}{d}{SPECIAL} x" for d in MULTILINGUAL]
    return docs


DOCS = documents()


def tiktoken_style_vocab():
    """cl100k_base when ../shared/vocab has it, else the project-trained cl100k-pattern one."""
    path = SHARED_VOCAB / "cl100k_base.tiktoken"
    return load_vocabulary(path) if path.is_file() else load_trained("cl100k")


@pytest.fixture(scope="module")
def gpu(device):
    """(the parent's GPU Encoding, its ids for DOCS); the GPU used before any fork."""
    enc = Encoding(tiktoken_style_vocab(), device=device)
    assert enc.backend.kind == "gpu"
    return enc, enc.encode_batch(DOCS, allowed_special="all")


# ---- what runs in the children ---------------------------------------------------------
# Pool tasks see the parent's Encoding through this module's globals, inherited by fork
# (as a DataLoader's dataset or a module-level tokenizer is); _SEEN collects the
# ForkedGpuWarnings of the process.

_PARENT: dict = {}
_SEEN: list = []


def _record_warnings():
    warnings.simplefilter("always", ForkedGpuWarning)   # no deduplication by warnings
    warnings.showwarning = lambda message, category, *rest: _SEEN.append(
        (category.__name__, str(message)))


def _pool_task(bounds):
    lo, hi = bounds
    enc = _PARENT["enc"]
    ids = enc.encode_batch(DOCS[lo:hi], allowed_special="all")
    flat, offsets = enc.encode_batch_flat(DOCS[lo:hi], allowed_special="all")
    texts = enc.decode_batch(ids)
    return os.getpid(), lo, ids, (flat.tolist(), offsets.tolist()), texts, list(_SEEN)


def test_fork_pool_children_get_the_parents_and_tiktokens_ids(gpu):
    enc, want = gpu
    _PARENT["enc"] = enc
    chunks = [(lo, min(lo + 25, len(DOCS))) for lo in range(0, len(DOCS), 25)]
    with FORK.Pool(4, initializer=_record_warnings) as pool:
        results = pool.map(_pool_task, chunks, chunksize=1)
    twin = tiktoken_twin(enc.vocab)
    assert want == twin.encode_batch(DOCS, allowed_special="all")
    warned: dict = {}
    for pid, lo, ids, (flat, offsets), texts, seen in results:
        assert pid != os.getpid()
        assert ids == want[lo:lo + len(ids)]
        assert [flat[offsets[i]:offsets[i + 1]] for i in range(len(ids))] == ids
        assert texts == DOCS[lo:lo + len(ids)]
        warned[pid] = max(warned.get(pid, []), seen, key=len)
    for pid, seen in warned.items():   # one warning per process, however many tasks it ran
        assert len(seen) == 1, (pid, seen)
        name, message = seen[0]
        assert name == "ForkedGpuWarning" and "'spawn'" in message and "'forkserver'" in \
            message and f"process {pid}" in message and "tiktoken" in message, message
    assert enc.backend.kind == "gpu"   # the parent keeps its GPU after its children exit
    assert enc.encode_batch(DOCS, allowed_special="all") == want


# ---- every public method, in a child, against the parent -------------------------------

def battery(enc: Encoding, docs: list[str]) -> dict:
    """Every public encode/decode method of `enc` on `docs`, as plain data."""
    out: dict = {}
    specials = enc.special_tokens_set
    out["ordinary_batch"] = ordinary = enc.encode_ordinary_batch(docs)
    out["batch_all"] = enc.encode_batch(docs, allowed_special="all")
    out["encode"] = [enc.encode(d, allowed_special="all") for d in docs[:12]]
    out["ordinary"] = enc.encode_ordinary(docs[-1])
    out["numpy"] = enc.encode_to_numpy(docs[-1], allowed_special="all").tolist()
    if specials:
        some = {sorted(specials)[0]}
        out["batch_some"] = enc.encode_batch([f"a{t}b" for t in sorted(specials)[:4]],
                                             allowed_special=some, disallowed_special=())
        try:
            enc.encode(f"x {sorted(specials)[0]} y")
        except ValueError as exc:
            out["disallowed"] = str(exc)
    flat, offsets = enc.encode_batch_flat(docs)
    out["flat"] = flat.tolist(), offsets.tolist()
    raw = [d.encode() for d in docs] + [b"caf\xc3\xa9 \xff\xfe x", b"ok \xe6\x97", b"\x80abc"]
    mixed = [d if i % 2 else r for i, (d, r) in enumerate(zip(docs, raw))] + raw[-3:]
    flat2, offsets2 = enc.encode_batch_flat(mixed, allowed_special="all")
    out["flat_mixed"] = flat2.tolist(), offsets2.tolist()
    buf = np.zeros(sum(map(len, raw)) + 8, np.uint32)
    ids3, offsets3 = enc.encode_batch_flat(docs, out=buf)
    out["flat_out"] = ids3.tolist(), offsets3.tolist()
    out["utf8_flat"] = [a.tolist() for a in enc._encode_utf8_batch_flat(raw[:len(docs)])]
    out["begun"] = [a.tolist() for a in enc._begin_utf8_batch_flat(raw[:len(docs)]).finish()]
    out["bytes"] = [enc.encode_bytes(r) for r in raw[-3:]]
    out["offsets"] = [enc.encode_with_offsets(d, unit, allowed_special="all")
                      for d in docs[:8] for unit in ("byte", "char")]
    if enc.vocab.merges is None:
        for text in ("hello fan", "naïve caf", "x  "):
            tokens, completions = enc.encode_with_unstable(text)
            out[f"unstable {text}"] = tokens, sorted(map(tuple, completions))
    out["single"] = [enc.encode_single_token(enc.decode_single_token_bytes(t))
                     for t in ordinary[0][:5]]
    out["decode_batch"] = enc.decode_batch(ordinary)
    out["decode_bytes_batch"] = enc.decode_bytes_batch([np.asarray(x, np.uint32)
                                                        for x in ordinary])
    out["decode_flat"] = enc.decode_bytes_batch_flat(flat, offsets)
    out["decode"] = [enc.decode(x) for x in ordinary[:6]]
    out["decode_bytes"] = enc.decode_bytes(flat2)
    out["decode_offsets"] = [enc.decode_with_offsets(x) for x in ordinary[:6]]
    out["tokens_bytes"] = enc.decode_tokens_bytes(ordinary[0])
    out["token_offsets"] = enc._token_offsets(flat, "char").tolist()
    try:
        enc.decode([1, enc.n_vocab + 7])
    except KeyError as exc:
        out["bad id"] = str(exc)
    if enc._hf is not None:
        out["hf_batch"] = enc.encode_hf_batch(docs)
        out["hf"] = enc.encode_hf(docs[-1], add_special_tokens=False)
        out["decode_hf"] = [enc.decode_hf(x) for x in out["hf_batch"][:6]]
    return out


def _run_in_fork(target, *args, timeout: float = 300):
    """target(*args) in a forked child (a non-daemon Process: it may fork again); its
    return value, or the exception's text raised as an AssertionError."""
    queue = FORK.Queue()

    def main():
        _SEEN.clear()   # a grandchild inherits its parent's list
        _record_warnings()
        try:
            queue.put(("ok", target(*args)))
        except BaseException:  # noqa: BLE001 (the parent reports it)
            queue.put(("error", traceback.format_exc()))

    child = FORK.Process(target=main)
    child.start()
    kind, value = queue.get(timeout=timeout)
    child.join(timeout=60)
    assert child.exitcode == 0, child.exitcode
    if kind == "error":
        raise AssertionError(f"in the forked child:\n{value}")
    return value


def _battery_in_child(enc, docs, hide=None):
    if hide:   # as if this library were not installed
        sys.modules[hide] = None
    result = battery(enc, docs)
    return result, enc.backend.engine, list(_SEEN)


def gpt2_style_json(tmp_path):
    from .test_tokenizer_dropin import gpt2_style_file
    return gpt2_style_file(tmp_path)


@pytest.mark.parametrize("case, engine", [
    ("tiktoken-style", "tiktoken"),
    ("custom pattern", "tiktoken"),           # our regex cuts, tiktoken merges
    ("tokenizer.json", "Hugging Face tokenizers"),
    ("deepseek", "Hugging Face tokenizers"),   # Split regexes, added tokens, BOS
    ("without tiktoken", "the plain-Python reference"),
])
def test_every_method_in_a_forked_child_equals_the_parent(case, engine, device, tmp_path):
    vocab = {"tiktoken-style": tiktoken_style_vocab,
             "without tiktoken": lambda: load_trained("gpt2"),
             "custom pattern": lambda: load_trained("custom"),
             "tokenizer.json": lambda: load_vocabulary(gpt2_style_json(tmp_path)),
             "deepseek": lambda: load_vocabulary(_shared("deepseek_tokenizer.json"))}[case]()
    docs = DOCS[:40] + MULTILINGUAL + DOCS[-12:]
    enc = Encoding(vocab, device=device)
    want = battery(enc, docs)
    got, used, seen = _run_in_fork(_battery_in_child, enc, docs,
                                   "tiktoken" if case == "without tiktoken" else None)
    assert used.startswith(engine), used
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == want[key], key
    assert len(seen) == 1 and "'spawn'" in seen[0][1] and engine in seen[0][1], seen
    if enc._hf is not None:   # and the parent's are tokenizers' own
        from tokenizers import Tokenizer
        hf = Tokenizer.from_file(str(vocab.source))
        assert want["hf_batch"] == [e.ids for e in hf.encode_batch(docs)]
    elif vocab.pattern_name is not None:
        assert want["ordinary_batch"] == tiktoken_twin(vocab).encode_ordinary_batch(docs)


def _shared(name: str):
    from .conftest import shared_vocab
    return shared_vocab(name)


# ---- a child that forks again; an unpickled Encoding; a new Encoding in the child --------

def _child_and_grandchild(enc, docs):
    ids = enc.encode_batch(docs, allowed_special="all")
    fresh = Encoding(enc.vocab)                        # made in the child: also off the GPU
    unpickled = pickle.loads(pickle.dumps(enc))       # lazy: builds its state here
    grand_ids, grand_seen, grand_pid = _run_in_fork(_grandchild, enc, docs)
    return (os.getpid(), ids, fresh.encode_batch(docs, allowed_special="all"),
            unpickled.encode_batch(docs, allowed_special="all"), list(_SEEN),
            grand_pid, grand_ids, grand_seen)


def _grandchild(enc, docs):
    return enc.encode_batch(docs, allowed_special="all"), list(_SEEN), os.getpid()


def test_a_child_that_forks_again(gpu):
    enc, want = gpu
    docs, expected = DOCS[::5], want[::5]
    pid, ids, fresh, unpickled, seen, grand_pid, grand_ids, grand_seen = \
        _run_in_fork(_child_and_grandchild, enc, docs)
    assert ids == fresh == unpickled == grand_ids == expected
    assert len(seen) == 1 and f"process {pid}" in seen[0][1]
    assert len(grand_seen) == 1 and f"process {grand_pid}" in grand_seen[0][1]
    assert enc.backend.kind == "gpu"
    assert enc.encode_batch(docs, allowed_special="all") == expected


# ---- DataLoader and datasets with their default start method ---------------------------

class _Docs:
    """A map-style dataset that tokenizes in __getitem__ (what a training script does)."""

    def __init__(self, enc, docs):
        self.enc, self.docs = enc, docs

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        return i, os.getpid(), forked.forked_from_gpu(), \
            self.enc.encode(self.docs[i], allowed_special="all")


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_torch_dataloader_workers_with_the_default_context(gpu):
    torch_data = pytest.importorskip("torch.utils.data")
    enc, want = gpu
    loader = torch_data.DataLoader(_Docs(enc, DOCS), batch_size=8, num_workers=4,
                                   collate_fn=list)   # the default context: fork on Linux
    seen, pids = {}, set()
    for batch in loader:
        for i, pid, from_gpu, ids in batch:
            seen[i] = ids
            pids.add(pid)
            assert pid != os.getpid()
            if multiprocessing.get_start_method() == "fork":
                assert from_gpu
    assert [seen[i] for i in range(len(DOCS))] == want
    assert len(pids) == 4
    assert enc.encode_batch(DOCS[:20], allowed_special="all") == want[:20]


def test_datasets_map_num_proc(gpu):
    datasets = pytest.importorskip(
        "datasets", reason="the `datasets` package is not installed (it is no test dependency "
                           "of istanbul; pip install datasets to run this test)")
    enc, want = gpu
    table = datasets.Dataset.from_dict({"text": DOCS})

    def tokenize(batch):
        n = len(batch["text"])
        return {"ids": enc.encode_batch(batch["text"], allowed_special="all"),
                "pid": [os.getpid()] * n, "from_gpu": [forked.forked_from_gpu()] * n}

    mapped = table.map(tokenize, batched=True, batch_size=16, num_proc=4)
    assert mapped["ids"] == want
    assert os.getpid() not in set(mapped["pid"]) and len(set(mapped["pid"])) > 1
    assert all(mapped["from_gpu"])   # forked workers (datasets' default on Linux)


# ---- the child never calls into wgpu ---------------------------------------------------

def child_env() -> dict:
    return dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                         os.environ.get("PYTHONPATH")])))


SPY_SCRIPT = textwrap.dedent("""
    import gc, importlib, os, sys, time, warnings
    from istanbul.shaders import engine
    from tokenizer_svc import encoding as E
    from tokenizer_svc.vocab import load_vocabulary

    vocab = load_vocabulary(sys.argv[1])
    docs = ["hello world", "héllo wörld 日本語 😀", "x" * 5000, "<|endoftext|> end"] * 20
    enc = E.Encoding(vocab)
    want = enc.encode_batch(docs, allowed_special="all")
    api = importlib.import_module({"wgpu": "wgpu.backends.wgpu_native._api",
                                   "dawn": "wgpudawn.backends.dawn._api"}[
                                      enc.backend.device.backend.name])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        real = api.libf

        class Spy:   # every call into the wgpu library goes through libf
            def __getattr__(self, name):
                os.write(write, f"wgpu call in the child: {name}\\n".encode())
                return getattr(real, name)

        api.libf = Spy()
        warnings.simplefilter("ignore")
        ok = (enc.encode_batch(docs, allowed_special="all") == want and
              E.Encoding(vocab).encode_batch(docs, allowed_special="all") == want and
              E.get_encoding(vocab).decode_batch(want) == docs)
        del enc             # drop everything that holds the parent's GPU state
        E._CACHE.clear()
        engine._default_devices.clear()
        gc.collect()
        os.write(write, b"child ids ok\\n" if ok else b"child ids WRONG\\n")
        os._exit(0)         # as multiprocessing, DataLoader and datasets end their children
    os.close(write)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:   # stuck in the driver (as when a release runs)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = "hung"
            break
        time.sleep(0.05)
    with os.fdopen(read) as f:
        print(f.read(), end="")
    print("child exit", status)
    print("parent ok", enc.backend.kind == "gpu" and
          enc.encode_batch(docs, allowed_special="all") == want)
""")


def test_the_child_never_calls_into_wgpu():
    vocab = tiktoken_style_vocab()
    env = child_env()
    done = subprocess.run([sys.executable, "-c", SPY_SCRIPT, str(vocab.source)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["child ids ok", "child exit 0", "parent ok True"], \
        done.stdout + done.stderr[-3000:]


# ---- a process forked before any GPU state still gets its own GPU ----------------------

def test_fork_before_any_gpu_state_uses_the_gpu_in_the_child():
    script = textwrap.dedent("""
        import os, sys
        from tokenizer_svc.encoding import Encoding
        from tokenizer_svc.vocab import load_vocabulary
        pid = os.fork()
        if pid == 0:
            enc = Encoding(load_vocabulary(sys.argv[1]))
            ok = enc.backend.kind == "gpu" and enc.encode("hello world") == \\
                enc.reference.encode_ordinary("hello world")
            os._exit(0 if ok else 3)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    env = child_env()
    done = subprocess.run([sys.executable, "-c", script, str(load_trained("gpt2").source)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "0", done.stdout + done.stderr[-3000:]

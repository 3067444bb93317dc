"""Clients built before the protocol grew (packed ids, offset pairs, uint32 counts, token
texts) keep working: stubs generated at test time from the old proto file
(tests/data/tokenizer_v1_old.proto), run in a process of their own (tests/data/old_client.py)
against a real server on loopback, read exactly what they read before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.service_support import TEXTS, server, tiny_encoding, tiny_vocab_path  # noqa: F401

DATA = Path(__file__).resolve().parent / "data"


def test_a_client_of_the_old_proto_reads_what_it_always_read(server, tiny_encoding, tmp_path):
    from grpc_tools import protoc
    assert protoc.main(["protoc", f"-I{DATA}", f"--python_out={tmp_path}",
                        f"--grpc_python_out={tmp_path}",
                        str(DATA / "tokenizer_v1_old.proto")]) == 0
    texts = [t for t in TEXTS if t]
    done = subprocess.run([sys.executable, str(DATA / "old_client.py"), server.target, *texts],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    enc = tiny_encoding
    for text, doc in zip(texts, got["docs"]):
        ids = list(enc.encode(text))
        assert doc["ids"] == ids and doc["token_count"] == len(ids) == doc["count"]
        assert doc["offsets"] == enc.token_offsets(ids, "byte").tolist()
        assert doc["decoded"] == text
    flat = [i for t in texts for i in enc.encode(t)]
    assert got["batch"]["ids"] == flat
    assert got["batch"]["token_counts"] == [len(enc.encode(t)) for t in texts]
    assert got["batch"]["doc_offsets"][-1] == len(flat)
    assert got["batch"]["decoded"] == texts

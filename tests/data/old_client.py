"""A client generated from tests/data/tokenizer_v1_old.proto (the protocol before the packed,
pair and uint32 fields): `tokenizer_v1_old_pb2*` on sys.path, nothing of istanbul imported.

    python old_client.py TARGET TEXT... > replies.json

For each text: Tokenize (plain, and with byte offsets), CountTokens, Detokenize of the ids;
once: TokenizeBatch of all texts and DetokenizeBatch of its reply. Prints what an old client
reads: the repeated `ids`, the uint64 `offsets`/`token_count`/`doc_offsets`, the bytes.
"""

import json
import sys

import grpc

import tokenizer_v1_old_pb2 as pb
import tokenizer_v1_old_pb2_grpc as pb_grpc


def main() -> int:
    target, texts = sys.argv[1], sys.argv[2:]
    out = {"docs": []}
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TokenizerStub(channel)
        for text in texts:
            plain = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=60)
            offsets = stub.Tokenize(pb.TokenizeRequest(text=text, offsets=pb.OFFSET_UNIT_BYTE),
                                    timeout=60)
            count = stub.CountTokens(pb.CountTokensRequest(text=text), timeout=60)
            back = stub.Detokenize(pb.DetokenizeRequest(ids=plain.ids), timeout=60)
            out["docs"].append({"ids": list(plain.ids), "token_count": plain.token_count,
                                "offsets": list(offsets.offsets), "count": count.count,
                                "decoded": back.data.decode("utf-8")})
        batch = stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=texts), timeout=60)
        decoded = stub.DetokenizeBatch(pb.DetokenizeBatchRequest(
            ids=batch.ids, seq_offsets=batch.doc_offsets), timeout=60)
        out["batch"] = {"ids": list(batch.ids), "doc_offsets": list(batch.doc_offsets),
                        "token_counts": list(batch.token_counts),
                        "decoded": [d.decode("utf-8") for d in decoded.data]}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

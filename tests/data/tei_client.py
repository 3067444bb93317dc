"""A client of TEI's tokenizer API that knows nothing of istanbul: only the stubs generated
from tests/data/tei.proto (`tei_pb2`, `tei_pb2_grpc`, on sys.path) and grpcio.

    python tei_client.py TARGET < calls.json > replies.json

Each call is {"rpc": "Tokenize"|"TokenizeStream"|"Decode"|"DecodeStream", "requests": [...]}
with the requests as JSON objects of TEI's fields; each reply is the list of responses (as
JSON, every field shown) or {"error": CODE, "details": ...}.
"""

import json
import sys

import grpc
from google.protobuf import json_format

import tei_pb2
import tei_pb2_grpc

REQUESTS = {"Tokenize": tei_pb2.EncodeRequest, "TokenizeStream": tei_pb2.EncodeRequest,
            "Decode": tei_pb2.DecodeRequest, "DecodeStream": tei_pb2.DecodeRequest}


def as_json(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def main() -> int:
    calls = json.load(sys.stdin)
    out = []
    with grpc.insecure_channel(sys.argv[1]) as channel:
        stub = tei_pb2_grpc.TokenizeStub(channel)
        for call in calls:
            requests = [json_format.ParseDict(r, REQUESTS[call["rpc"]]())
                        for r in call["requests"]]
            try:
                if call["rpc"].endswith("Stream"):
                    replies = list(getattr(stub, call["rpc"])(iter(requests), timeout=60))
                else:
                    replies = [getattr(stub, call["rpc"])(r, timeout=60) for r in requests]
                out.append([as_json(r) for r in replies])
            except grpc.RpcError as exc:
                out.append({"error": exc.code().name, "details": exc.details()})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

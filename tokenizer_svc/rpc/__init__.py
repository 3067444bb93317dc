"""Generated gRPC code for istanbul.tokenizer.v1 (tokenizer_pb2, tokenizer_pb2_grpc).

Checked in; regenerate with `python -m tokenizer_svc.rpc.generate` after editing
proto/istanbul/tokenizer/v1/tokenizer.proto (tests/test_service_proto.py fails when stale).
"""

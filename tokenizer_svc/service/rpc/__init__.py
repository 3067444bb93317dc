"""Generated gRPC code: istanbul.tokenizer.v1 (tokenizer_pb2, tokenizer_pb2_grpc) and the
tei.v1 tokenizer API (tei_pb2, tei_pb2_grpc).

Checked in; regenerate with `python -m tokenizer_svc.service.rpc.generate` after editing
proto/istanbul/tokenizer/v1/tokenizer.proto or proto/tei/v1/tei.proto
(tests/test_service_proto.py fails when stale).
"""

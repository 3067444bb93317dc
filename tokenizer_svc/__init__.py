"""Tokenizer: vocabularies, CPU reference, GPU encode/decode, gRPC service."""

"""The attention family: causal GQA attention for training, KV-cache decoding (see ops.py, decode.py)."""

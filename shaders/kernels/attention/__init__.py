"""The attention family: causal GQA attention for training (ops.py), KV-cache decoding
(decode.py)."""

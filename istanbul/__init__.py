"""istanbul: GPU BPE tokenizer service and WGSL training daemon (the command-line entry)."""

__version__ = "0.1.0"

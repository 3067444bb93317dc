"""Export a checkpoint as a Hugging Face Llama folder that `transformers` loads as is.

    export_hf("ckpt/run/latest", "out/hf")   # config.json, model.safetensors,
                                              # generation_config.json, tokenizer files

Weights are renamed to Hugging Face's Llama names and written as fp32 safetensors; the
architecture matches exactly (RMSNorm in f32, SwiGLU MLP, RoPE pairing i with i + head_dim/2,
no biases), so LlamaForCausalLM gives the same logits as istanbul for the same ids. The
vocabulary goes along as `tokenizer.json` (byte-level BPE built from the ranks with the
`tokenizers` library: every two-token split of a token is a merge ranked like the token)
plus the original file.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from safetensors.numpy import save_file

from .checkpoint import read_checkpoint
from ..model.config import ModelConfig


def hf_names(cfg: ModelConfig) -> dict[str, str]:
    """istanbul parameter name -> Hugging Face Llama name."""
    names = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight"}
    if not cfg.tied_head:
        names["head"] = "lm_head.weight"
    for i in range(cfg.n_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        names.update({
            p + "wq": h + "self_attn.q_proj.weight", p + "wk": h + "self_attn.k_proj.weight",
            p + "wv": h + "self_attn.v_proj.weight", p + "wo": h + "self_attn.o_proj.weight",
            p + "w_gate": h + "mlp.gate_proj.weight", p + "w_up": h + "mlp.up_proj.weight",
            p + "w_down": h + "mlp.down_proj.weight",
            p + "attn_norm": h + "input_layernorm.weight",
            p + "ffn_norm": h + "post_attention_layernorm.weight"})
    return names


def hf_config(cfg: ModelConfig, eot: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_seq,
        "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": cfg.tied_head,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
        "dtype": "float32", "bos_token_id": eot, "eos_token_id": eot,
    }


def export_hf(checkpoint, out_dir) -> Path:
    ck = read_checkpoint(checkpoint)
    cfg, layout = ck["config"], ck["layout"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = layout.unpack(ck["params"])
    names = hf_names(cfg)
    tensors = {names[n]: w for n, w in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    eot = None
    if ck["vocab_file"] is not None:
        eot = _export_tokenizer(ck["vocab_file"], out)
    (out / "config.json").write_text(json.dumps(hf_config(cfg, eot), indent=2) + "\n")
    gen = {"bos_token_id": eot, "eos_token_id": eot, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out


def _export_tokenizer(vocab_file: Path, out: Path) -> int | None:
    from tokenizer_svc.vocab import load_vocabulary
    vocab = load_vocabulary(vocab_file)
    shutil.copyfile(vocab_file, out / vocab_file.name)
    if vocab_file.suffix == ".json":  # already a tokenizer.json
        shutil.copyfile(vocab_file, out / "tokenizer.json")
    else:
        sidecar = Path(str(vocab_file) + ".json")
        if sidecar.is_file():
            shutil.copyfile(sidecar, out / sidecar.name)
        tokenizer_json(vocab).save(str(out / "tokenizer.json"))
    eot = vocab.eot_token
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30,
              "clean_up_tokenization_spaces": False}
    if eot is not None:
        config.update(bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return eot


def oniguruma_pattern(pattern: str) -> str:
    """`pattern` (tiktoken's regex dialect) as Hugging Face tokenizers' Oniguruma reads it the
    same: tiktoken's possessive interval `X{1,3}+` is, to Oniguruma, `(X{1,3})+` (one or more
    runs of 1-3), so "2025" became "20" "25" instead of "202" "5". Where an interval ends its
    alternative, as in the known patterns, the greedy interval matches the same."""
    return re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


def tokenizer_json(vocab):
    """A `tokenizers.Tokenizer` equal to a tiktoken-style vocabulary (ranks + pattern)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizer_svc.vocab import bytes_to_unicode
    byte_map = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(byte_map[b] for b in token)

    ranks = vocab.ranks
    # tiktoken merges the adjacent pair whose concatenation has the lowest rank, whichever
    # split produced it; so every split of a token into two tokens is a merge, with the
    # token's own rank as its priority (as transformers' tiktoken converter does)
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            a, b = token[:cut], token[cut:]
            if a in ranks and b in ranks:
                merges.append((rank, ranks[a], ranks[b], text(a), text(b)))
    merges = [(a, b) for *_, a, b in sorted(merges)]
    model = models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges,
                       ignore_merges=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(oniguruma_pattern(vocab.pattern)), behavior="isolated",
                             invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    if vocab.special_tokens:
        tok.add_special_tokens([AddedToken(t, special=True) for t, _ in
                                sorted(vocab.special_tokens.items(), key=lambda kv: kv[1])])
    return tok

"""The training step's buffers, planned once and checked against the device before anything
is allocated.

    plan = plan_step(cfg, layout.total, device, batch=8, seq=1024, precision="f16")
    plan.head_rows        # rows per LM-head chunk (ChunkedHead)
    plan.heads_dtype      # the saved head-major q, k, v (BlockBuffers); plan.act_dtype: h, h2, s
    plan.needs            # every buffer GpuModel allocates, in bytes (what the fit check counted)

Decided here, in this order (GpuModel allocates exactly the plan; nothing below re-plans):
1. Precision: "mixed" and "f16" keep an f16 mirror of the weights (the device must have
   shader-f16); "f16" runs the matmuls on the tensor cores where the device has f16 subgroup
   matrices (`tensor_cores`). There the head's cross-entropy writes dlogits in f16
   (`f16_dlogits`), the attention's saved q, k, v are f16 where its kernels take f16 operands
   (`f16_heads`), and h, h2 and s, which only feed matmuls, are f16 unless `f16_math` or
   `f16_activations=False` (`f16_acts`): the values the tensor-core matmuls round to anyway.
2. The LM head's rows per chunk (`plan_chunk_rows`): the logits chunk must fit one storage
   binding and one buffer (lavapipe: 128 MiB; the H200: 2 GiB / 4 GiB) and a memory budget
   (LOGITS_BUDGET, or less when the device's memory minus everything else is smaller); chunks
   are balanced (8192 rows in 4 x 2048, not 3 x 2684 + 140) and rounded to 64 rows for the
   matmul tiles. A chunk's row views start on the storage offset alignment (256 bytes), so a
   chunk is a multiple of 256 / gcd(256, 4 d) rows: 1 row when d % 64 == 0.
3. The fit check (`check_fits`): a tensor the kernels bind whole must fit one storage binding
   (and one buffer), and the sum, with HEADROOM, the device's memory when it is known
   (`device_memory`: the host's RAM for software Vulkan, `nvidia-smi`'s for NVIDIA adapters,
   else None: only the binding and buffer limits are checked). A configuration that does not
   fit raises ConfigDoesNotFitError saying what to change: a deterministic error (a daemon
   fails such a job at once, no retries).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from istanbul_errors import UserFacingError
from istanbul.shaders.kernels.attention import ops as attention
from istanbul.shaders.kernels.embedding import ops as embedding
from istanbul.shaders.kernels.matmul import ops as linear

from .config import ModelConfig
from .forward import fused_qkv, head_strides

HEADROOM = 1.10   # split-K scratch, uniforms, the driver's own: 10% over what we count
# Bytes of one logits chunk (the device limits may cap it lower): 2 GiB keeps 124m/gpt2 at
# 8 x 1024 in one chunk (1.6 GB) and puts o200k_base's 6.5 GB in 4 chunks of 2048
# rows.
LOGITS_BUDGET = 2 << 30
FIT_HINT = ("use a smaller batch or sequence length (keep the tokens per step with "
            "grad_accum), or a smaller model or vocabulary")


class ConfigDoesNotFitError(UserFacingError):
    """A model/batch/sequence/vocabulary that cannot fit the device: retrying cannot help."""


# ---- the plan -----------------------------------------------------------------------------

@dataclass(frozen=True)
class StepPlan:
    """What GpuModel allocates for one optimizer step of grad_accum micro-batches of
    batch x seq tokens (rows = batch * seq)."""
    batch: int
    seq: int
    grad_accum: int
    rows: int
    precision: str          # "mixed", "fp32" or "f16"
    mixed: bool             # the f16 weight mirror
    f16_math: bool          # forward matmuls in packed f16 (mixed only)
    tensor_cores: bool      # every matmul on the f16 subgroup matrices (precision f16)
    f16_heads: bool         # saved head-major q, k, v (and the backward's do copy) in f16
    f16_acts: bool          # h, h2 and s in f16
    f16_dlogits: bool       # the head's dlogits in an f16 buffer of their own
    head_rows: int          # rows per LM-head chunk
    ids_stride: int         # elements between micro-batch slots of ids, targets, losses
    needs: tuple            # every buffer, as Need (what check_fits counted)

    @property
    def heads_dtype(self):
        return np.float16 if self.f16_heads else np.float32

    @property
    def act_dtype(self):
        return np.float16 if self.f16_acts else np.float32

    @property
    def embed_plan_stride(self) -> int:
        """Elements between micro-batch slots of the embedding backward's plans."""
        return align64(embedding.plan_size(self.rows))


def plan_step(cfg: ModelConfig, total: int, device, *, batch: int, seq: int,
              precision: str = "mixed", grad_accum: int = 1, f16_math: bool = False,
              head_chunk_rows: int | None = None, f16_activations: bool = True,
              memory: int | None = None) -> StepPlan:
    """The plan of one training step (see the module docstring) for a model of `total`
    parameters; raises ValueError for a precision or f16_math it cannot honour,
    RuntimeError for a mirror without shader-f16, ConfigDoesNotFitError when it does not fit.

    `head_chunk_rows` forces the head's chunk (tests); `memory`: bytes the fit check and the
    head's chunk assume the device has (default: `device_memory(device)`, None when unknown).
    """
    if precision not in ("mixed", "fp32", "f16"):     # training/precision.py's PRECISIONS
        raise ValueError(f"precision must be mixed, fp32 or f16, got {precision!r}")
    mixed = precision in ("mixed", "f16")
    if f16_math and precision != "mixed":
        raise ValueError("f16_math needs precision='mixed' (it multiplies the f16 weights)")
    tensor_cores = precision == "f16" and linear.has_tensor_cores(device)
    if mixed and not device.has("shader-f16"):
        raise RuntimeError(f"mixed precision needs the shader-f16 feature, which "
                           f"{device.name} lacks; use precision='fp32'")
    d, n = cfg.d_model, batch * seq
    f16_dlogits = tensor_cores
    f16_heads = tensor_cores and attention.takes_f16_operands(
        device, tensor_cores, cfg.head_dim,
        head_strides(cfg, seq) + (attention.token_rows(seq, cfg.head_dim, d),))
    f16_acts = tensor_cores and not f16_math and f16_activations

    def needs(logits_rows: int) -> list[Need]:
        return memory_needs(cfg, total, batch=batch, seq=seq, grad_accum=grad_accum,
                            mixed=mixed, logits_rows=logits_rows, f16_dlogits=f16_dlogits,
                            f16_heads=f16_heads, f16_acts=f16_acts)

    memory = device_memory(device) if memory is None else memory
    budget = LOGITS_BUDGET
    if memory is not None:      # the head gets what everything else leaves free
        free = int(memory / HEADROOM) - sum(x.nbytes * x.count for x in needs(0))
        if f16_dlogits:   # each row of f32 logits brings half a row of f16 dlogits
            free = free * 2 // 3
        budget = max(min(budget, free), chunk_quantum(device, d) * cfg.vocab_size * 4)
    head_rows = plan_chunk_rows(device, n, d, cfg.vocab_size, budget=budget,
                                chunk_rows=head_chunk_rows)
    final = needs(head_rows)
    check_fits(device, final, hint=FIT_HINT, memory=memory)
    return StepPlan(batch=batch, seq=seq, grad_accum=grad_accum, rows=n, precision=precision,
                    mixed=mixed, f16_math=f16_math, tensor_cores=tensor_cores,
                    f16_heads=f16_heads, f16_acts=f16_acts, f16_dlogits=f16_dlogits,
                    head_rows=head_rows, ids_stride=align64(n), needs=tuple(final))


# ---- the buffers and their bytes ----------------------------------------------------------

@dataclass(frozen=True)
class Need:
    what: str
    nbytes: int             # of one buffer
    binding: bool = True    # bound whole by a kernel (must fit one storage binding)
    count: int = 1          # this many buffers of nbytes each (e.g. one per layer)


def align64(n: int) -> int:
    """n rounded up to 64 elements (a 256-byte aligned slot of 4-byte elements)."""
    return -(-n // 64) * 64


def memory_needs(cfg: ModelConfig, total: int, *, batch: int, seq: int, grad_accum: int,
                 mixed: bool, logits_rows: int, f16_dlogits: bool = False,
                 f16_heads: bool = False, f16_acts: bool = False) -> list[Need]:
    """Every buffer GpuModel allocates, in bytes; f16_heads: the saved head-major q, k, v in
    f16 (and the attention backward's f16 copy of do); f16_acts: h, h2 and s in f16."""
    n, d, f, kv, V = batch * seq, cfg.d_model, cfg.ffn_hidden, cfg.kv_dim, cfg.vocab_size
    hb = 2 if f16_heads else 4   # bytes per saved q, k, v element
    ab = 2 if f16_acts else 4    # bytes per h, h2, s element
    qkv = n * (d + 2 * kv) * 4
    layers = cfg.n_layers   # BlockBuffers: each saved activation is its own buffer per layer
    needs = [Need("parameters", total * 4), Need("gradients", total * 4),
             Need("AdamW moments", 2 * total * 4, binding=False),
             Need(f"block activations x, attn, xa (B*T = {n} rows x d)", n * d * 4,
                  count=3 * layers),
             Need(f"block activations h, h2 (B*T = {n} rows x d)", n * d * ab, count=2 * layers),
             Need("block rstd, rstd2", n * 4, count=2 * layers),
             Need("block q (head-major)", n * d * hb, count=layers),
             Need("block k, v (head-major)", n * kv * hb, count=2 * layers),
             Need("block attention lse", cfg.n_heads * n * 4, count=layers),
             Need(f"block gate|up (B*T x 2F = {2 * f})", n * 2 * f * 4, count=layers),
             Need(f"block SwiGLU output (B*T x F = {f})", n * f * ab, count=layers),
             Need("FFN activations (B*T x 2F)", n * 2 * f * 4),
             Need("q|k|v projection (B*T x (d + 2kv))", qkv, binding=fused_qkv(cfg)),
             Need("dq (head-major)", n * d * 4), Need("dk, dv (head-major)", n * kv * 4, count=2),
             Need("backward scratch", (3 * n * d + n * 3 * f) * 4 + qkv, binding=False),
             Need("final norm (B*T x d)", 2 * n * d * 4),
             Need(f"logits chunk ({logits_rows} rows x vocab {V})", logits_rows * V * 4),
             Need("token ids, targets, losses", grad_accum * align64(n) * 4 * 5,
                  binding=False)]
    if mixed:
        needs.append(Need("f16 weight mirror", total * 2))
    if f16_heads:
        needs.append(Need("attention do in f16 (scratch)", n * d * 2, binding=False))
    if f16_dlogits:
        needs.append(Need(f"f16 dlogits chunk ({logits_rows} rows x vocab {V})",
                          logits_rows * V * 2))
    return needs


# ---- the LM head's chunk ------------------------------------------------------------------

def chunk_quantum(device, d: int) -> int:
    """Rows between chunk starts so that a view at row r0 of a [rows, d] f32 buffer binds."""
    align = int(device.limits.get("min-storage-buffer-offset-alignment", 256)) // 4
    return align // math.gcd(align, d)


def logits_limit(device, budget: int = LOGITS_BUDGET) -> int:
    """Bytes one logits chunk may take on this device."""
    return min(int(device.limits.get("max-storage-buffer-binding-size", 1 << 27)),
               int(device.limits.get("max-buffer-size", 1 << 28)), int(budget))


def plan_chunk_rows(device, rows: int, d: int, vocab: int, *, budget: int = LOGITS_BUDGET,
                    chunk_rows: int | None = None) -> int:
    """Rows per chunk of the LM head (see the module docstring); `chunk_rows` forces a value
    (tests), checked against the alignment and the limits."""
    limit = logits_limit(device, budget)
    quantum = chunk_quantum(device, d)
    per_row = vocab * 4
    cap = limit // per_row
    if chunk_rows:
        c = int(chunk_rows)
        if c < 1 or (c < rows and c % quantum):
            raise ValueError(f"head chunk of {c} rows: must be a multiple of {quantum} rows "
                             f"(d_model {d} and the device's offset alignment)")
        if min(c, rows) * per_row > limit:
            raise ConfigDoesNotFitError(
                f"a head chunk of {c} rows x vocab {vocab} needs {c * per_row / 2**20:.0f} MiB, "
                f"more than {limit / 2**20:.0f} MiB on {device.name}: use fewer chunk rows")
        return min(c, rows)
    if cap >= rows:
        return rows
    if cap < quantum:
        raise ConfigDoesNotFitError(
            f"one row of logits over a vocabulary of {vocab} ids takes "
            f"{quantum * per_row / 2**20:.1f} MiB per chunk of {quantum} rows, more than "
            f"{device.name} allows in one binding ({limit / 2**20:.0f} MiB): use a smaller "
            "vocabulary, or a d_model that is a multiple of 64")
    step = quantum * 64 // math.gcd(quantum, 64)   # tile-friendly when the cap allows it
    if cap < step:
        step = quantum
    chunks = -(-rows // cap)
    c = -(-(-(-rows // chunks)) // step) * step   # balanced, rounded up to `step`
    if c > cap:
        c = cap // step * step
    return c


# ---- the device's limits ------------------------------------------------------------------

def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 10 * 2**30 else f"{n / 2**30:,.1f} GiB"


def device_memory(device) -> int | None:
    """Bytes of memory the device can allocate, when known (see the module docstring)."""
    info = getattr(device, "info", None)
    if info is not None and info.is_software:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    if "nvidia" in device.name.lower() and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        sizes = [int(line.rsplit(",", 1)[1]) * 2**20 for line in out.splitlines()
                 if "," in line and line.rsplit(",", 1)[1].strip().isdigit()]
        return min(sizes) if sizes else None
    return None


def check_fits(device, needs: list[Need], *, hint: str, memory: int | None) -> int:
    """Raise ConfigDoesNotFitError unless every need fits; returns the total bytes counted.

    `hint` says what to change (e.g. "use a smaller batch or sequence length"); `memory`:
    bytes the device can allocate (`device_memory(device)`), None when unknown.
    """
    binding = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
    buffer = int(device.limits.get("max-buffer-size", 1 << 28))
    for need in needs:
        limit = min(binding, buffer) if need.binding else buffer
        if need.nbytes > limit:
            raise ConfigDoesNotFitError(
                f"{need.what} needs {_mib(need.nbytes)} in one binding, more than "
                f"{device.name}'s limit of {_mib(limit)}: {hint}")
    total = sum(n.nbytes * n.count for n in needs)
    if memory is not None and total * HEADROOM > memory:
        largest = sorted(needs, key=lambda n: -n.nbytes * n.count)[:3]
        parts = ", ".join(f"{n.what} {_mib(n.nbytes * n.count)}" for n in largest)
        raise ConfigDoesNotFitError(
            f"this configuration needs about {_mib(total * HEADROOM)} on {device.name}, which "
            f"has {_mib(memory)} (largest: {parts}): {hint}")
    return total

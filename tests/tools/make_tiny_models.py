#!/usr/bin/env python3
"""Writes the tiny random-weight models that the C++ tests load.

Every model is deterministic (seeded NumPy), small enough to run in milliseconds, and exists in the
file forms the engine reads: HF safetensors directories (F32/BF16/F16) and GGUF files (F32, F16,
BF16, Q8_0, Q4_0, Q4_1), written the way llama.cpp's convert_hf_to_gguf writes them. The HF and GGUF
forms of one model hold the same weights, so an engine must produce the same logits from both;
reference_forward.py checks that the files themselves agree.

Usage: make_tiny_models.py OUT   (needs OUT/tokenizers/{bpe,qwen2,spm}/ from make_tiny_tokenizers.py)
"""

import argparse
import math
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import safetensors
from safetensors import TensorSpec


@dataclass(frozen=True)
class TinyShape:
    """Hyper-parameters shared by all tiny models (GQA: 2 query heads per KV head)."""
    vocab: int = 512          # matches the tiny tokenizers
    hidden: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    n_layers: int = 3
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    context: int = 256


SHAPE = TinyShape()
# Rows of 256 values, the K-quant super-block, for the tiny model in the K-quant and 5-bit types.
WIDE_SHAPE = TinyShape(hidden=256, head_dim=64, ffn=512, n_layers=2)

# tiny_llama_kquant.gguf: the mix of types a Q4_K_M / Q5_K_M download holds (llama.cpp keeps
# attn_v, ffn_down and the output in Q6_K, falls back to Q5_0 / Q5_1 where rows do not fit 256).
KQUANT_TYPES = {
    "token_embd.weight": gguf.GGMLQuantizationType.Q4_K,
    "output.weight": gguf.GGMLQuantizationType.Q6_K,
    "blk.0.attn_q.weight": gguf.GGMLQuantizationType.Q4_K,
    "blk.0.attn_k.weight": gguf.GGMLQuantizationType.Q4_K,
    "blk.0.attn_v.weight": gguf.GGMLQuantizationType.Q6_K,
    "blk.0.attn_output.weight": gguf.GGMLQuantizationType.Q4_K,
    "blk.0.ffn_gate.weight": gguf.GGMLQuantizationType.Q4_K,
    "blk.0.ffn_up.weight": gguf.GGMLQuantizationType.Q4_K,
    "blk.0.ffn_down.weight": gguf.GGMLQuantizationType.Q6_K,
    "blk.1.attn_q.weight": gguf.GGMLQuantizationType.Q5_K,
    "blk.1.attn_k.weight": gguf.GGMLQuantizationType.Q5_K,
    "blk.1.attn_v.weight": gguf.GGMLQuantizationType.Q5_1,
    "blk.1.attn_output.weight": gguf.GGMLQuantizationType.Q5_K,
    "blk.1.ffn_gate.weight": gguf.GGMLQuantizationType.Q5_0,
    "blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q5_K,
    "blk.1.ffn_down.weight": gguf.GGMLQuantizationType.Q6_K,
}

# GGUF file types of the quantized variants: 2-D weights (token_embd and every linear) take the
# type, 1-D tensors (norms, biases) stay F32, as llama.cpp's converter and quantizer do.
GGUF_VARIANTS = {
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
}


def log(msg: str) -> None:
    print(f"[make_tiny_models] {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Weights


def random_weights(seed: int, *, qkv_bias: bool, tied: bool, n_layers: int = SHAPE.n_layers,
                   shape: TinyShape = SHAPE) -> dict[str, np.ndarray]:
    """HF-named float32 weights, [out, in] like nn.Linear.

    Scales keep the residual stream O(1) and the logits spread (std ~1.5) rather than flat:
    linear weights ~ N(0, (1.2/sqrt(fan_in))^2), so each projection of an RMS-normalised input has
    entries of order 1 and attention scores have std ~1 (clearly non-uniform, yet not so sharp that
    float32 rounding in an engine gets amplified); norms are 1 + small noise so a wrong norm weight
    (or a missing one) changes the result. Embeddings get the lm-head scale because a tied model
    uses them as its lm head.
    """
    rng = np.random.default_rng(seed)
    s = shape
    q_rows, kv_rows = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim

    def linear(rows: int, cols: int, gain: float = 1.2) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": linear(s.vocab, s.hidden, 1.5)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(s.hidden)
        w[p + "self_attn.q_proj.weight"] = linear(q_rows, s.hidden)
        w[p + "self_attn.k_proj.weight"] = linear(kv_rows, s.hidden)
        w[p + "self_attn.v_proj.weight"] = linear(kv_rows, s.hidden)
        if qkv_bias:
            # Qwen2 checkpoints carry sizeable K biases; make them matter here too.
            w[p + "self_attn.q_proj.bias"] = (0.3 * rng.standard_normal(q_rows)).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (0.5 * rng.standard_normal(kv_rows)).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (0.3 * rng.standard_normal(kv_rows)).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = linear(s.hidden, q_rows)
        w[p + "post_attention_layernorm.weight"] = norm(s.hidden)
        w[p + "mlp.gate_proj.weight"] = linear(s.ffn, s.hidden)
        w[p + "mlp.up_proj.weight"] = linear(s.ffn, s.hidden)
        w[p + "mlp.down_proj.weight"] = linear(s.hidden, s.ffn)
    w["model.norm.weight"] = norm(s.hidden)
    if not tied:
        w["lm_head.weight"] = linear(s.vocab, s.hidden, 1.5)
    return w


# HF name suffix -> GGUF name suffix (per layer), and the non-layer tensors.
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # Phi-3's fused projections (GGUF keeps the fused gate/up under ffn_up).
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model, layers, N, rest
    return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"


def permute_for_interleaved_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorders Q/K rows from HF's half-rotation RoPE layout to GGUF llama's interleaved one.

    HF rotates pairs (i, i + d/2) of each head; GGUF llama (like the original Meta checkpoints)
    rotates adjacent pairs (2i, 2i+1). Moving row i -> 2i and row i + d/2 -> 2i+1 within each
    head makes the two conventions compute the same attention scores.
    """
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


# ---------------------------------------------------------------------------------------------
# Writers


def write_safetensors(path: Path, weights: dict[str, np.ndarray], dtype: str) -> None:
    """dtype: "float32", "float16" or "bfloat16" (NumPy has no bfloat16, so those are raw uint16)."""
    keep_alive, specs = [], {}
    for name, w in weights.items():
        if dtype == "bfloat16":
            # Round-to-nearest-even, the same rounding torch and ggml use.
            a = gguf.quants.quantize(w, gguf.GGMLQuantizationType.BF16).view(np.uint16)
        else:
            a = np.ascontiguousarray(w.astype(dtype))
        keep_alive.append(a)  # the specs point into these buffers until the file is written
        specs[name] = TensorSpec(dtype=dtype, shape=w.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
    safetensors.serialize_file(specs, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # the writer creates files 0600


PHI3_SLIDING_WINDOW = 200  # below the tiny context (256): the engine serves 200 positions


def fuse_phi3(weights: dict) -> dict:
    """Llama-layout weights in Phi-3's form: q, k, v stacked into qkv_proj, gate and up (gate
    first) into gate_up_proj."""
    out = {}
    for name, w in weights.items():
        p = name.rsplit(".", 2)[0] + "."  # model.layers.N.self_attn. / .mlp.
        if name.endswith("self_attn.q_proj.weight"):
            out[p + "qkv_proj.weight"] = np.concatenate(
                [w, weights[p + "k_proj.weight"], weights[p + "v_proj.weight"]])
        elif name.endswith("mlp.gate_proj.weight"):
            out[p + "gate_up_proj.weight"] = np.concatenate([w, weights[p + "up_proj.weight"]])
        elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            out[name] = w
    return out


def hf_config(arch: str, tied: bool, tok_meta: dict, dtype: str,
              rope_scaling: dict | None = None) -> dict:
    s = SHAPE
    cfg = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "phi3": "Phi3ForCausalLM"}[arch]],
        "model_type": arch,
        "hidden_size": s.hidden,
        "intermediate_size": s.ffn,
        "num_attention_heads": s.n_heads,
        "num_key_value_heads": s.n_kv_heads,
        "num_hidden_layers": s.n_layers,
        "head_dim": s.head_dim,
        "rms_norm_eps": s.rms_eps,
        "rope_theta": s.rope_base,
        "vocab_size": s.vocab,
        "max_position_embeddings": s.context,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "torch_dtype": dtype,
    }
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in tok_meta:
            cfg[key] = tok_meta[f"tokenizer.ggml.{key}"]
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    if arch == "phi3":
        cfg["sliding_window"] = PHI3_SLIDING_WINDOW
    return cfg


def write_hf_dir(out: Path, arch: str, weights: dict, tied: bool, tok_dir: Path, tok_meta: dict,
                 dtype: str, rope_scaling: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(arch, tied, tok_meta, dtype, rope_scaling)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_safetensors(out / "model.safetensors", weights, dtype)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the config is optional
        if (tok_dir / name).is_file():
            shutil.copyfile(tok_dir / name, out / name)


def write_hf_sharded_dir(out: Path, arch: str, weights: dict, tied: bool, tok_dir: Path,
                         tok_meta: dict) -> None:
    """An HF directory whose weights are split over three shards named by
    model.safetensors.index.json, as checkpoints above ~1B are published: the embeddings and
    layer 0 in F32, layer 1 in BF16, the rest in F16."""
    write_hf_dir(out, arch, weights, tied, tok_dir, tok_meta, "float32")
    (out / "model.safetensors").unlink()
    n = 3
    shards = [{}, {}, {}]
    for name, w in weights.items():
        if name == "model.embed_tokens.weight" or name.startswith("model.layers.0."):
            shards[0][name] = w
        elif name.startswith("model.layers.1."):
            shards[1][name] = w
        else:
            shards[2][name] = w
    weight_map, total = {}, 0
    for i, (part, dtype) in enumerate(zip(shards, ("float32", "bfloat16", "float16"))):
        file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_safetensors(out / file, part, dtype)
        for name, w in part.items():
            weight_map[name] = file
            total += w.size * (4 if dtype == "float32" else 2)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def load_tokenizer_meta(path: Path) -> dict:
    """Reads make_tiny_tokenizers.py's GGUF tokenizer description: {"tokenizer.ggml.KEY": value}.

    Keys without the "tokenizer.ggml." prefix are accepted and prefixed.
    """
    raw = json.loads(path.read_text())
    meta = {}
    for key, value in raw.items():
        meta[key if key.startswith("tokenizer.") else f"tokenizer.ggml.{key}"] = value
    if "tokenizer.ggml.model" not in meta or "tokenizer.ggml.tokens" not in meta:
        raise SystemExit(f"{path}: expected at least tokenizer.ggml.model and tokenizer.ggml.tokens")
    if len(meta["tokenizer.ggml.tokens"]) != SHAPE.vocab:
        raise SystemExit(f"{path}: {len(meta['tokenizer.ggml.tokens'])} tokens, tiny models need {SHAPE.vocab}")
    return meta


def add_tokenizer_meta(writer: gguf.GGUFWriter, meta: dict) -> None:
    """Adds the tokenizer keys with the GGUF value types llama.cpp's converter uses."""
    T = gguf.GGUFValueType
    for key, value in meta.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)  # token ids are uint32 in llama.cpp's files
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list) and key.endswith(".scores"):
            writer.add_array(key, [float(x) for x in value])  # FLOAT32 array
        elif isinstance(value, list) and key.endswith(".token_type"):
            writer.add_key_value(key, [int(x) for x in value], T.ARRAY, sub_type=T.INT32)
        elif isinstance(value, list):
            writer.add_array(key, value)  # strings (tokens, merges)
        else:
            raise SystemExit(f"tokenizer key {key}: unsupported value type {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
# K-quant and 5-bit blocks. gguf-py dequantizes these types but quantizes none of them, so they
# are written here (plainly: min/max per sub-block, no search) and read back with gguf-py's own
# dequantizer, which the reference forward pass also uses.


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _scaled_levels(x, lo, scale, levels):
    """round((x - lo) / scale) clipped to [0, levels], 0 where the scale is 0."""
    safe = np.where(scale == 0, 1, scale)
    return np.clip(np.rint((x - lo) / safe), 0, levels).astype(np.uint8) * (scale != 0)


def _quantize_k4k5(x: np.ndarray, bits: int) -> list[np.ndarray]:
    """Q4_K / Q5_K: [n, 256] -> (d, dmin, scales[12], [qh[32],] qs[128]) byte parts."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    levels = (1 << bits) - 1
    lo = np.minimum(sub.min(axis=-1), 0)
    hi = sub.max(axis=-1)
    sub_scale, sub_min = (hi - lo) / levels, -lo
    d = _f16(sub_scale.max(axis=-1) / 63)
    dmin = _f16(sub_min.max(axis=-1) / 63)
    sc = _scaled_levels(sub_scale, 0, d[:, None], 63)
    m = _scaled_levels(sub_min, 0, dmin[:, None], 63)
    ds = (d[:, None] * sc.astype(np.float32))[..., None]
    dm = (dmin[:, None] * m.astype(np.float32))[..., None]
    q = _scaled_levels(sub, -dm, ds, levels)  # [n, 8, 32]
    scales = np.zeros((n, 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    low = q & 0xF
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(n, 128)
    parts = [d.astype(np.float16).view(np.uint8).reshape(n, 2),
             dmin.astype(np.float16).view(np.uint8).reshape(n, 2), scales]
    if bits == 5:
        qh = np.zeros((n, 32), dtype=np.uint8)
        for g in range(8):
            qh |= ((q[:, g] >> 4) & 1) << g
        parts.append(qh)
    return parts + [qs]


def _quantize_q6_k(x: np.ndarray) -> list[np.ndarray]:
    """Q6_K: [n, 256] -> (ql[128], qh[64], scales[16] int8, d) byte parts."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    amax = np.abs(sub).max(axis=-1)
    d = _f16(amax.max(axis=-1) / (32 * 127))
    safe_d = np.where(d == 0, 1, d)
    sc = np.clip(np.rint(amax / 32 / safe_d[:, None]), 0, 127).astype(np.int8)
    step = (d[:, None] * sc.astype(np.float32))[..., None]
    q = (_scaled_levels(sub, -32 * step, step, 63)).reshape(n, 256)  # q - 32 in [-32, 31]
    ql = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 64), dtype=np.uint8)
    for half in range(2):
        v = q[:, half * 128:(half + 1) * 128]
        ql[:, half * 64:half * 64 + 32] = (v[:, 0:32] & 0xF) | ((v[:, 64:96] & 0xF) << 4)
        ql[:, half * 64 + 32:half * 64 + 64] = (v[:, 32:64] & 0xF) | ((v[:, 96:128] & 0xF) << 4)
        qh[:, half * 32:(half + 1) * 32] = ((v[:, 0:32] >> 4) | ((v[:, 32:64] >> 4) << 2) |
                                            ((v[:, 64:96] >> 4) << 4) | ((v[:, 96:128] >> 4) << 6))
    return [ql, qh, sc.view(np.uint8), d.astype(np.float16).view(np.uint8).reshape(n, 2)]


def _quantize_q5(x: np.ndarray, offset: bool) -> list[np.ndarray]:
    """Q5_0 (d * (q - 16)) / Q5_1 (d * q + m): [n, 32] -> byte parts."""
    n = x.shape[0]
    if offset:
        lo, hi = x.min(axis=-1), x.max(axis=-1)
        d, m = _f16((hi - lo) / 31), _f16(lo)
        q = _scaled_levels(x, m[:, None], d[:, None], 31)
    else:
        amax = np.abs(x).max(axis=-1)
        d = _f16(amax / 15)
        q = _scaled_levels(x, -16 * d[:, None], d[:, None], 31)
    qh = np.zeros(n, dtype=np.uint32)
    for j in range(32):
        qh |= ((q[:, j].astype(np.uint32) >> 4) & 1) << j
    qs = (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)
    parts = [d.astype(np.float16).view(np.uint8).reshape(n, 2)]
    if offset:
        parts.append(m.astype(np.float16).view(np.uint8).reshape(n, 2))
    return parts + [qh.view(np.uint8).reshape(n, 4), qs]


def quantize_blocks(w: np.ndarray, qtype) -> np.ndarray:
    """[rows, cols] float32 -> raw GGUF bytes [rows, row_bytes] of qtype, checked by reading it
    back with gguf-py's dequantizer."""
    Q = gguf.GGMLQuantizationType
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = w.shape
    x = w.reshape(-1, block).astype(np.float32)
    parts = {Q.Q4_K: lambda: _quantize_k4k5(x, 4), Q.Q5_K: lambda: _quantize_k4k5(x, 5),
             Q.Q6_K: lambda: _quantize_q6_k(x), Q.Q5_0: lambda: _quantize_q5(x, False),
             Q.Q5_1: lambda: _quantize_q5(x, True)}[qtype]()
    data = np.concatenate(parts, axis=-1)
    assert data.shape == (x.shape[0], size), (qtype, data.shape)
    data = data.reshape(rows, cols // block * size)
    back = gguf.quants.dequantize(data, qtype).reshape(rows, cols)
    err = np.abs(back - w).max() / np.abs(w).max()
    if not err < 0.2:
        raise SystemExit(f"{qtype.name} blocks read back with error {err:.3f} of the largest weight")
    return data


# Scaled RoPE in the tiny models: short original contexts so that the 40 golden positions and
# the head's 8 frequency pairs cover every branch of each formula.
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
YARN_SCALING = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
LINEAR_SCALING = {"rope_type": "linear", "factor": 2.0}


def llama3_rope_freqs(scaling: dict, shape: TinyShape = SHAPE) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf writes it for Llama 3: per pair, the
    divisor of the base frequency (1, factor, or the smooth blend between)."""
    d = shape.head_dim
    freqs = 1.0 / (shape.rope_base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path: Path, arch: str, weights: dict, tok_meta: dict, variant: str | None,
               name: str, shape: TinyShape = SHAPE, types: dict | None = None,
               rope_freqs: np.ndarray | None = None, scaling: dict | None = None) -> None:
    """Writes `weights` (HF names/layout) as a GGUF of `arch`; variant None = all F32. `types`
    gives a type per GGUF tensor name (quantized by quantize_blocks) instead of a variant.
    rope_freqs adds Llama 3's factor tensor, scaling the rope.scaling.* keys of a linear or YaRN
    scaling (a config.json rope_scaling object), as llama.cpp's converter writes them."""
    s = shape
    qtype, ftype = GGUF_VARIANTS[variant] if variant else (gguf.GGMLQuantizationType.F32,
                                                           gguf.LlamaFileType.ALL_F32)
    if types:
        ftype = gguf.LlamaFileType.MOSTLY_Q4_K_M
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(sum(1 for k in weights if k.endswith("input_layernorm.weight")))
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.ffn)
    writer.add_head_count(s.n_heads)
    writer.add_head_count_kv(s.n_kv_heads)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_layer_norm_rms_eps(s.rms_eps)
    writer.add_rope_dimension_count(s.head_dim)
    writer.add_vocab_size(s.vocab)
    writer.add_file_type(ftype)
    if variant or types:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        writer.add_rope_scaling_type({"linear": gguf.RopeScalingType.LINEAR,
                                      "yarn": gguf.RopeScalingType.YARN}[kind])
        writer.add_rope_scaling_factor(scaling["factor"])
        if kind == "yarn":
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    if arch == "phi3":
        writer.add_sliding_window(PHI3_SLIDING_WINDOW)
    add_tokenizer_meta(writer, tok_meta)

    for hf_name, w in weights.items():
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            w = permute_for_interleaved_rope(w, s.n_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            w = permute_for_interleaved_rope(w, s.n_kv_heads)
        if types and gguf_name(hf_name) in types:
            t = types[gguf_name(hf_name)]
            writer.add_tensor(gguf_name(hf_name), quantize_blocks(w, t), raw_dtype=t)
        elif w.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(w, qtype)
            # F16 comes back as float16 (typed); the rest as raw bytes that need the type given.
            writer.add_tensor(gguf_name(hf_name), data,
                              raw_dtype=None if data.dtype == np.float16 else qtype)
        else:
            writer.add_tensor(gguf_name(hf_name), np.ascontiguousarray(w, dtype=np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="test data directory (holds tokenizers/, receives the models)")
    args = ap.parse_args()
    out: Path = args.out
    toks = out / "tokenizers"
    for sub in ("bpe", "qwen2", "spm"):
        if not (toks / sub / "gguf_tokenizer.json").is_file():
            raise SystemExit(f"missing {toks / sub / 'gguf_tokenizer.json'}: run make_tiny_tokenizers.py first")

    bpe_meta = load_tokenizer_meta(toks / "bpe" / "gguf_tokenizer.json")
    qwen_meta = load_tokenizer_meta(toks / "qwen2" / "gguf_tokenizer.json")
    spm_meta = load_tokenizer_meta(toks / "spm" / "gguf_tokenizer.json")

    log("tiny_llama (HF F32/BF16/F16, GGUF F32 + quantized variants)")
    llama = random_weights(seed=1, qkv_bias=False, tied=False)
    write_hf_dir(out / "tiny_llama_hf", "llama", llama, False, toks / "bpe", bpe_meta, "float32")
    write_hf_dir(out / "tiny_llama_hf_bf16", "llama", llama, False, toks / "bpe", bpe_meta, "bfloat16")
    write_hf_dir(out / "tiny_llama_hf_f16", "llama", llama, False, toks / "bpe", bpe_meta, "float16")
    write_hf_sharded_dir(out / "tiny_llama_hf_sharded", "llama", llama, False, toks / "bpe",
                         bpe_meta)
    write_gguf(out / "tiny_llama.gguf", "llama", llama, bpe_meta, None, "tiny_llama")
    for variant in GGUF_VARIANTS:
        write_gguf(out / f"tiny_llama_{variant}.gguf", "llama", llama, bpe_meta, variant,
                   f"tiny_llama_{variant}")

    log("tiny_llama RoPE scaling (Llama 3 factors and linear, in HF and GGUF)")
    write_hf_dir(out / "tiny_llama_hf_llama3", "llama", llama, False, toks / "bpe", bpe_meta,
                 "float32", LLAMA3_SCALING)
    write_gguf(out / "tiny_llama_llama3.gguf", "llama", llama, bpe_meta, None, "tiny_llama_llama3",
               rope_freqs=llama3_rope_freqs(LLAMA3_SCALING))
    write_hf_dir(out / "tiny_llama_hf_linear", "llama", llama, False, toks / "bpe", bpe_meta,
                 "float32", LINEAR_SCALING)
    write_gguf(out / "tiny_llama_linear.gguf", "llama", llama, bpe_meta, None, "tiny_llama_linear",
               scaling=LINEAR_SCALING)

    log("tiny_qwen2 (QKV bias, tied embeddings, NeoX RoPE; YaRN in HF and GGUF)")
    qwen = random_weights(seed=2, qkv_bias=True, tied=True)
    write_hf_dir(out / "tiny_qwen2_hf", "qwen2", qwen, True, toks / "qwen2", qwen_meta, "float32")
    write_gguf(out / "tiny_qwen2.gguf", "qwen2", qwen, qwen_meta, None, "tiny_qwen2")
    write_hf_dir(out / "tiny_qwen2_hf_yarn", "qwen2", qwen, True, toks / "qwen2", qwen_meta,
                 "float32", YARN_SCALING)
    write_gguf(out / "tiny_qwen2_yarn.gguf", "qwen2", qwen, qwen_meta, None, "tiny_qwen2_yarn",
               scaling=YARN_SCALING)

    log("tiny_qwen2_untied (its own lm head, as Qwen2.5 from 3B up: lm_head / output.weight)")
    qwen_untied = random_weights(seed=7, qkv_bias=True, tied=False)
    write_hf_dir(out / "tiny_qwen2_untied_hf", "qwen2", qwen_untied, False, toks / "qwen2",
                 qwen_meta, "float32")
    write_gguf(out / "tiny_qwen2_untied.gguf", "qwen2", qwen_untied, qwen_meta, None,
               "tiny_qwen2_untied")

    log("tiny_spm (llama arch, SentencePiece tokenizer)")
    spm = random_weights(seed=3, qkv_bias=False, tied=False)
    write_gguf(out / "tiny_spm.gguf", "llama", spm, spm_meta, None, "tiny_spm")
    # The same model as a Hugging Face directory whose tokenizer.json is the converted
    # SentencePiece model, as TinyLlama and Phi-3 are published.
    write_hf_dir(out / "tiny_spm_hf", "llama", spm, False, toks / "spm_hf", spm_meta, "float32")

    log("tiny_llama_kquant (256-wide rows in Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1)")
    wide = random_weights(seed=5, qkv_bias=False, tied=False, n_layers=WIDE_SHAPE.n_layers,
                          shape=WIDE_SHAPE)
    write_gguf(out / "tiny_llama_kquant_f32.gguf", "llama", wide, bpe_meta, None,
               "tiny_llama_kquant_f32", shape=WIDE_SHAPE)
    write_gguf(out / "tiny_llama_kquant.gguf", "llama", wide, bpe_meta, None, "tiny_llama_kquant",
               shape=WIDE_SHAPE, types=KQUANT_TYPES)

    log("tiny_phi3 (fused QKV and gate/up, a sliding window, in HF and GGUF)")
    phi3 = fuse_phi3(random_weights(seed=6, qkv_bias=False, tied=False))
    write_hf_dir(out / "tiny_phi3_hf", "phi3", phi3, False, toks / "bpe", bpe_meta, "float32")
    write_gguf(out / "tiny_phi3.gguf", "phi3", phi3, bpe_meta, None, "tiny_phi3")

    log("tiny_llama_deep (8 layers: several candidate groups for calibration)")
    deep = random_weights(seed=4, qkv_bias=False, tied=False, n_layers=8)
    write_gguf(out / "tiny_llama_deep.gguf", "llama", deep, bpe_meta, None, "tiny_llama_deep")


if __name__ == "__main__":
    main()

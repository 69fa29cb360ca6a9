#!/usr/bin/env python3
"""Independent NumPy (float64) forward pass of Llama / Qwen2 models; writes golden data.

The C++ engine is tested against what this script writes: logits, next-token NLL, post-RoPE keys,
values and every layer's attention input, for one token sequence. Nothing here shares code with
the engine: weights come from the `gguf` package (dequantized with gguf.quants) or from
`safetensors`, hyper-parameters from the file's own metadata or config.json.

RoPE layout follows the file: GGUF llama rotates interleaved pairs (2i, 2i+1) because
convert_hf_to_gguf permutes the Q/K rows; GGUF qwen2 and every HF checkpoint rotate pairs
(i, i + d/2). Keys are stored in that same layout, i.e. as the engine's KV cache holds them.

Output: OUT/golden/NAME/{golden.json, logits.f32, nll.f32, k_L.f32, v_L.f32, attn_in_L.f32}
(little-endian float32, row-major; shapes in golden.json's comments below).
"""

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from quiet import quiet_native_stderr

# A passage of real English prose: the GPL-3 preamble (/usr/share/common-licenses/GPL-3; verbatim
# copying is permitted). Kept inline so the fixture does not depend on that file, and chosen with
# no digits and no apostrophes so that every tokenizer fallback below pre-tokenizes it alike.
GPL_PASSAGE = (
    "When we speak of free software, we are referring to freedom, not price. Our General Public "
    "Licenses are designed to make sure that you have the freedom to distribute copies of free "
    "software (and charge for them if you wish), that you receive source code or can get it if "
    "you want it, that you can change the software or use pieces of it in new free programs, and "
    "that you know you can do these things. To protect your rights, we need to prevent others "
    "from denying you these rights or asking you to surrender the rights."
)


def log(msg: str) -> None:
    print(f"[reference_forward] {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Model loading: both file forms end up as the same structure, with GGUF-style tensor names and
# [out, in] matrices, dequantized to float64 on first use.


@dataclass
class Model:
    path: Path
    arch: str                 # "llama" or "qwen2"
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_base: float
    rope_interleaved: bool    # True: pairs (2i, 2i+1); False: pairs (i, i + d/2)
    rope_inv_freq: np.ndarray | None = None   # scaled RoPE: each pair's frequency, [d/2]
    rope_mscale: float = 1.0                  # YaRN's factor on cos and sin
    loaders: dict = field(default_factory=dict)   # name -> () -> float32/float64 ndarray
    cache: dict = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.loaders

    def w(self, name: str) -> np.ndarray:
        if name not in self.cache:
            self.cache[name] = np.asarray(self.loaders[name](), dtype=np.float64)
        return self.cache[name]


# ---------------------------------------------------------------------------------------------
# Scaled RoPE, after transformers' modeling_rope_utils (_compute_linear_scaling_parameters,
# _compute_llama3_parameters, _compute_yarn_parameters): the frequencies themselves.


def scaled_inv_freq(kind: str, p: dict, base: float, d: int, max_pos: int):
    """(inv_freq [d/2], mscale) of a rope_scaling entry."""
    inv_freq = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    factor = float(p.get("factor", 1.0))
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        lo, hi = float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        old = float(p.get("original_max_position_embeddings") or max_pos)
        beta_fast, beta_slow = float(p.get("beta_fast") or 32), float(p.get("beta_slow") or 1)

        def correction_dim(rotations):
            return (d * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        interp = inv_freq / factor
        mscale = p.get("attention_factor") or (1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0)
        return interp * (1 - extrapolation) + inv_freq * extrapolation, float(mscale)
    raise SystemExit(f"unsupported rope scaling {kind!r}")


def split_fused(m: Model) -> None:
    """Phi-3's fused attn_qkv (q, k, v rows) and ffn_gate_up (gate rows, then up) as the separate
    matrices the forward pass reads."""
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    for i in range(m.n_layers):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in m.loaders:
            fused = m.loaders.pop(p + "attn_qkv.weight")
            for name, lo, hi in (("attn_q", 0, q), ("attn_k", q, q + kv), ("attn_v", q + kv, q + 2 * kv)):
                m.loaders[p + name + ".weight"] = (lambda f, a, b: lambda: f()[a:b])(fused, lo, hi)
        if p + "ffn_gate_up.weight" in m.loaders:
            fused = m.loaders.pop(p + "ffn_gate_up.weight")
            half = lambda f, first: lambda: np.split(f(), 2)[0 if first else 1]  # noqa: E731
            m.loaders[p + "ffn_gate.weight"] = half(fused, True)
            m.loaders[p + "ffn_up.weight"] = half(fused, False)


def load_gguf(path: Path) -> Model:
    import gguf  # imported here so HF-only runs do not need it

    reader = gguf.GGUFReader(str(path))

    def meta(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = meta("general.architecture")
    if arch not in ("llama", "qwen2", "phi3"):
        raise SystemExit(f"{path}: unsupported architecture {arch!r}")
    n_heads = int(meta(f"{arch}.attention.head_count"))
    hidden = int(meta(f"{arch}.embedding_length"))
    head_dim = int(meta(f"{arch}.attention.key_length", hidden // n_heads))
    rope_dims = int(meta(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise SystemExit(f"{path}: partial RoPE ({rope_dims} of {head_dim}) is not supported")

    tensors = {t.name: t for t in reader.tensors}

    def loader(t):
        # Quantized data comes as raw bytes per row; dequantize gives [rows, cols] float32.
        return lambda: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            tuple(int(x) for x in reversed(t.shape)))

    m = Model(path=path, arch=arch,
              n_layers=int(meta(f"{arch}.block_count")),
              hidden=hidden, n_heads=n_heads,
              n_kv_heads=int(meta(f"{arch}.attention.head_count_kv", n_heads)),
              head_dim=head_dim,
              vocab=int(meta(f"{arch}.vocab_size", tensors["token_embd.weight"].shape[1])),
              rms_eps=float(meta(f"{arch}.attention.layer_norm_rms_epsilon")),
              rope_base=float(meta(f"{arch}.rope.freq_base", 10000.0)),
              rope_interleaved=(arch == "llama"))
    m.loaders = {name: loader(t) for name, t in tensors.items() if name != "rope_freqs.weight"}
    if arch == "phi3":  # fused gate/up under ffn_up
        for i in range(m.n_layers):
            m.loaders[f"blk.{i}.ffn_gate_up.weight"] = m.loaders.pop(f"blk.{i}.ffn_up.weight")
        split_fused(m)
    if "rope_freqs.weight" in tensors:  # Llama 3: a divisor of each pair's frequency
        factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64)
        m.rope_inv_freq = m.rope_base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) / factors
    kind = meta(f"{arch}.rope.scaling.type", "none")
    if kind != "none":
        m.rope_inv_freq, m.rope_mscale = scaled_inv_freq(kind, {
            "factor": meta(f"{arch}.rope.scaling.factor", 1.0),
            "original_max_position_embeddings": meta(f"{arch}.rope.scaling.original_context_length"),
        }, m.rope_base, head_dim, int(meta(f"{arch}.context_length")))
    return m


_HF_LAYER = {
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
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_gate_up.weight",
}
_HF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}


def _safetensors_array(info: dict) -> np.ndarray:
    """One tensor from safetensors.deserialize; BF16 widened by hand (NumPy has no bfloat16)."""
    raw = bytes(info["data"])
    if info["dtype"] == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32)
    else:
        arr = np.frombuffer(raw, dtype={"F32": "<f4", "F16": "<f2", "F64": "<f8"}[info["dtype"]])
    return arr.reshape(info["shape"])


def load_hf(path: Path) -> Model:
    import safetensors

    cfg = json.loads((path / "config.json").read_text())
    arch = cfg["model_type"]
    if arch not in ("llama", "qwen2", "phi3"):
        raise SystemExit(f"{path}: unsupported model_type {arch!r}")
    n_heads = cfg["num_attention_heads"]
    m = Model(path=path, arch=arch,
              n_layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], n_heads=n_heads,
              n_kv_heads=cfg.get("num_key_value_heads", n_heads),
              head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
              # GGUF stores eps as float32 and engines add it in float32; rounding the config's
              # value the same way keeps HF and GGUF forms of one model comparable to ~1e-13.
              vocab=cfg["vocab_size"], rms_eps=float(np.float32(cfg["rms_norm_eps"])),
              rope_base=cfg.get("rope_theta", 10000.0), rope_interleaved=False)
    arrays = {}
    for file in sorted(path.glob("*.safetensors")):
        for name, info in safetensors.deserialize(file.read_bytes()):
            arrays[name] = _safetensors_array(info)
    for name, arr in arrays.items():
        if name in _HF_GLOBAL:
            new = _HF_GLOBAL[name]
        else:
            parts = name.split(".", 3)  # model, layers, N, rest
            new = f"blk.{parts[2]}.{_HF_LAYER[parts[3]]}"
        m.loaders[new] = (lambda a: lambda: a)(arr)
    if cfg.get("tie_word_embeddings", False):
        m.loaders.pop("output.weight", None)
    split_fused(m)
    if cfg.get("rope_scaling"):
        r = cfg["rope_scaling"]
        m.rope_inv_freq, m.rope_mscale = scaled_inv_freq(
            r.get("rope_type", r.get("type")), r, m.rope_base, m.head_dim,
            cfg.get("max_position_embeddings", 2048))
    return m


def load_model(path: Path) -> Model:
    return load_hf(path) if path.is_dir() else load_gguf(path)


# ---------------------------------------------------------------------------------------------
# Forward pass


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x: np.ndarray, m: "Model") -> np.ndarray:
    """x: [n_tokens, n_heads, head_dim], token t at position t."""
    n_tokens, _, d = x.shape
    interleaved = m.rope_interleaved
    inv_freq = (m.rope_inv_freq if m.rope_inv_freq is not None
                else m.rope_base ** (-np.arange(0, d, 2, dtype=np.float64) / d))  # [d/2]
    angle = np.arange(n_tokens, dtype=np.float64)[:, None] * inv_freq     # [T, d/2]
    cos = m.rope_mscale * np.cos(angle)[:, None, :]
    sin = m.rope_mscale * np.sin(angle)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : d // 2], out[..., d // 2:] = ra, rb
    return out


@dataclass
class ForwardResult:
    logits: np.ndarray            # [T, vocab]
    k: list                       # per layer [T, n_kv_heads, head_dim], after RoPE
    v: list                       # per layer [T, n_kv_heads, head_dim]
    attn_in: list                 # per layer [T, hidden]


def forward(m: Model, tokens: list[int]) -> ForwardResult:
    T, d = len(tokens), m.head_dim
    rep = m.n_heads // m.n_kv_heads  # query heads per KV head; q head h reads KV head h // rep
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    res = ForwardResult(logits=None, k=[], v=[], attn_in=[])

    def linear(x, name):
        y = x @ m.w(name + ".weight").T
        return y + m.w(name + ".bias") if m.has(name + ".bias") else y

    x = m.w("token_embd.weight")[tokens]                                  # [T, hidden]
    for layer in range(m.n_layers):
        p = f"blk.{layer}."
        h = rms_norm(x, m.w(p + "attn_norm.weight"), m.rms_eps)
        res.attn_in.append(h)
        q = rope(linear(h, p + "attn_q").reshape(T, m.n_heads, d), m)
        k = rope(linear(h, p + "attn_k").reshape(T, m.n_kv_heads, d), m)
        v = linear(h, p + "attn_v").reshape(T, m.n_kv_heads, d)
        res.k.append(k)
        res.v.append(v)
        qg = q.reshape(T, m.n_kv_heads, rep, d)
        scores = np.einsum("tgrd,sgd->grts", qg, k) / math.sqrt(d) + causal
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("grts,sgd->tgrd", probs, v).reshape(T, m.n_heads * d)
        x = x + attn @ m.w(p + "attn_output.weight").T
        h = rms_norm(x, m.w(p + "ffn_norm.weight"), m.rms_eps)
        gate = h @ m.w(p + "ffn_gate.weight").T
        up = h @ m.w(p + "ffn_up.weight").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ m.w(p + "ffn_down.weight").T
    x = rms_norm(x, m.w("output_norm.weight"), m.rms_eps)
    head = "output.weight" if m.has("output.weight") else "token_embd.weight"  # tied if absent
    res.logits = x @ m.w(head).T
    return res


def next_token_nll(logits: np.ndarray, tokens: list[int]) -> np.ndarray:
    """[T-1]: -log softmax(logits[i])[tokens[i+1]]."""
    z = logits[:-1] - logits[:-1].max(axis=-1, keepdims=True)
    logz = np.log(np.exp(z).sum(axis=-1))
    return logz - z[np.arange(len(tokens) - 1), tokens[1:]]


# ---------------------------------------------------------------------------------------------
# Tokenizing the built-in passage with the model's own vocabulary


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def builtin_bpe(text: str, vocab: list[str], merges: list[str]) -> list[int]:
    """Byte-level BPE for plain ASCII prose (letters, spaces, punctuation only).

    On such text the GPT-2 / SmolLM pre-tokenizer regexes reduce to the simple one below, so this
    needs neither the `regex` module nor a tokenizer library. It is the last-resort fallback.
    """
    if not re.fullmatch(r"[A-Za-z .,;:!?()\-]+", text):
        raise ValueError("builtin_bpe only handles letters, spaces and basic punctuation")
    b2u = _byte_to_unicode()
    rank = {tuple(mg.split(" ", 1)): i for i, mg in enumerate(merges)}
    ids = {tok: i for i, tok in enumerate(vocab)}
    out = []
    for piece in re.findall(r" ?[A-Za-z]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", text):
        sym = [b2u[b] for b in piece.encode()]
        while len(sym) > 1:
            best = min(range(len(sym) - 1), key=lambda i: rank.get((sym[i], sym[i + 1]), math.inf))
            if (sym[best], sym[best + 1]) not in rank:
                break
            sym[best:best + 2] = [sym[best] + sym[best + 1]]
        out.extend(ids[s] for s in sym)
    return out


def tokenize_passage(model_path: Path, text: str) -> tuple[list[int], str]:
    """Tokens of `text` (no BOS) for a GGUF BPE model, and which tokenizer produced them.

    Preference: llama.cpp itself (the engine must match it), then an HF `tokenizers` BPE built
    from the GGUF vocab/merges, then builtin_bpe. Whichever wins is cross-checked against
    builtin_bpe, since a disagreement means one of them (or the vocabulary file) is wrong.
    """
    import gguf

    reader = gguf.GGUFReader(str(model_path))
    vocab = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    builtin = builtin_bpe(text, vocab, merges)

    tokens, source = None, None
    try:
        from llama_cpp import Llama
        with quiet_native_stderr():
            lm = Llama(str(model_path), vocab_only=True, verbose=False)
            tokens = list(lm.tokenize(text.encode(), add_bos=False, special=False))
            del lm
        source = "llama.cpp"
    except Exception as e:  # not installed, or llama.cpp rejects the tokenizer metadata
        log(f"llama.cpp tokenizer unavailable for {model_path.name} ({type(e).__name__}: {e})")
    if tokens is None:
        try:
            from tokenizers import Tokenizer, models, pre_tokenizers
            bpe = models.BPE(vocab={t: i for i, t in enumerate(vocab)},
                             merges=[tuple(mg.split(" ", 1)) for mg in merges])
            tk = Tokenizer(bpe)
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
            tokens, source = tk.encode(text, add_special_tokens=False).ids, "tokenizers"
        except ImportError:
            tokens, source = builtin, "builtin_bpe"
    if tokens != builtin:
        log(f"WARNING: {source} and builtin_bpe disagree on the passage:\n  {tokens}\n  {builtin}")
    return tokens, source


# ---------------------------------------------------------------------------------------------
# Golden output


def write_golden(out_dir: Path, m: Model, tokens: list[int], res: ForwardResult, tol: float,
                 nll_tol: float, extra: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)

    def save(name: str, arr: np.ndarray) -> str:
        arr.astype("<f4").tofile(out_dir / name)
        return name

    nll = next_token_nll(res.logits, tokens)
    files = {
        "logits": save("logits.f32", res.logits),                                    # [T, vocab]
        "nll": save("nll.f32", nll),                                                 # [T-1]
        "k": [save(f"k_{i}.f32", k) for i, k in enumerate(res.k)],                   # [T, n_kv, d]
        "v": [save(f"v_{i}.f32", v) for i, v in enumerate(res.v)],                   # [T, n_kv, d]
        "attn_in": [save(f"attn_in_{i}.f32", a) for i, a in enumerate(res.attn_in)],  # [T, hidden]
    }
    golden = {
        "model": str(m.path.resolve()),
        "tokens": [int(t) for t in tokens],
        "n_layers": m.n_layers, "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads,
        "head_dim": m.head_dim, "hidden": m.hidden, "vocab": m.vocab,
        "arch": m.arch, "rope_layout": "interleaved" if m.rope_interleaved else "half",
        "files": files,
        "tolerance": {"logits": tol, "kv": tol, "attn_in": tol, "nll": nll_tol,
                      "rule": "max|engine-ref| <= tol * max(1, max|ref|) per tensor; nll: max abs diff"},
        "stats": {"mean_nll": float(nll.mean()),
                  "max_abs_logit": float(np.abs(res.logits).max()),
                  "argmax": [int(a) for a in res.logits.argmax(axis=-1)]},
        **extra,
    }
    (out_dir / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")


def check_same_model(a: Model, ra: ForwardResult, b: Model, rb: ForwardResult,
                     tol: float = 1e-10) -> None:
    """Asserts two files of the same weights (e.g. GGUF vs safetensors) compute the same thing.

    Keys are compared after mapping the interleaved layout onto the half-rotation one, which is
    exactly the Q/K row permutation convert_hf_to_gguf applies; a wrong permutation fails here.
    """
    def rel(x, y):
        return float(np.abs(x - y).max() / max(1.0, np.abs(y).max()))

    d = a.head_dim
    # interleaved index 2i+j holds half-layout index j*d/2 + i
    to_half = np.empty(d, dtype=int)
    to_half[[j * (d // 2) + i for i in range(d // 2) for j in range(2)]] = np.arange(d)

    def layout(k, m):
        return k[..., to_half] if m.rope_interleaved else k

    worst = {"logits": rel(ra.logits, rb.logits)}
    worst["k"] = max(rel(layout(x, a), layout(y, b)) for x, y in zip(ra.k, rb.k))
    worst["v"] = max(rel(x, y) for x, y in zip(ra.v, rb.v))
    worst["attn_in"] = max(rel(x, y) for x, y in zip(ra.attn_in, rb.attn_in))
    log(f"same-model check {a.path.name} vs {b.path.name}: " +
        ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    bad = {k: v for k, v in worst.items() if not v <= tol}
    if bad:
        raise SystemExit(f"{a.path} and {b.path} disagree (relative max diff {bad}): "
                         "the GGUF Q/K permutation or a tensor mapping is wrong")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="GGUF file or HF safetensors directory")
    ap.add_argument("--name", required=True, help="golden set name: writes OUT/golden/NAME/")
    ap.add_argument("--out", type=Path, required=True, help="test data directory")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--random-tokens", type=int, metavar="N", help="N uniformly random token ids")
    src.add_argument("--passage-tokens", type=int, metavar="N",
                     help="the first N tokens of a built-in English passage (GGUF BPE models only)")
    src.add_argument("--tokens-json", type=Path, help="JSON list of token ids")
    ap.add_argument("--seed", type=int, default=1234, help="seed for --random-tokens")
    ap.add_argument("--bos", action="store_true", help="prepend the model's BOS token")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="logits/kv/attn_in tolerance, relative to max(1, max|ref|)")
    ap.add_argument("--nll-tol", type=float, default=1e-4, help="absolute NLL tolerance")
    ap.add_argument("--same-tol", type=float, default=1e-10,
                    help="largest relative difference --same-as allows (GGUF stores Llama 3's "
                         "RoPE factors in float32, about 3e-8 from the config's float64 ones)")
    ap.add_argument("--same-as", type=Path,
                    help="another file of the same weights; assert both give identical results")
    args = ap.parse_args()

    m = load_model(args.model)
    extra = {}
    if args.random_tokens:
        tokens = [int(t) for t in np.random.default_rng(args.seed).integers(0, m.vocab, args.random_tokens)]
        extra["token_source"] = f"random(seed={args.seed})"
    elif args.passage_tokens:
        ids, source = tokenize_passage(args.model, GPL_PASSAGE)
        if len(ids) < args.passage_tokens:
            raise SystemExit(f"passage has only {len(ids)} tokens, {args.passage_tokens} requested")
        tokens = ids[: args.passage_tokens]
        extra.update(token_source=f"passage via {source}", text=GPL_PASSAGE)
    else:
        tokens = json.loads(args.tokens_json.read_text())
        extra["token_source"] = str(args.tokens_json)
    if args.bos:
        import gguf
        bos = gguf.GGUFReader(str(args.model)).fields["tokenizer.ggml.bos_token_id"].contents()
        tokens = [int(bos)] + tokens
        extra["bos"] = int(bos)

    log(f"{args.name}: {m.arch} {m.n_layers} layers, {len(tokens)} tokens")
    res = forward(m, tokens)
    if args.same_as:
        other = load_model(args.same_as)
        check_same_model(m, res, other, forward(other, tokens), args.same_tol)
    write_golden(args.out / "golden" / args.name, m, tokens, res, args.tol, args.nll_tol, extra)
    nll = next_token_nll(res.logits, tokens)
    log(f"{args.name}: mean NLL {nll.mean():.4f}, max|logit| {np.abs(res.logits).max():.3f}")


if __name__ == "__main__":
    main()

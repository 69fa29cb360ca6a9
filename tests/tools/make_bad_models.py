#!/usr/bin/env python3
"""Writes deliberately broken models next to the tiny ones, for the loader's error tests.

Each is tiny_llama.gguf (or tiny_llama_hf/) with exactly one defect:
  bad_missing_tensor.gguf  blk.1.ffn_up.weight left out
  bad_unknown_arch.gguf    general.architecture = "mamba"
  bad_tensor_type.gguf     blk.0.attn_q.weight stored as Q8_1, a type riskkv does not read
  bad_shape.gguf           blk.0.attn_k.weight with one row too few
  bad_config_hf/           config.json without num_hidden_layers
and GGUF RoPE metadata riskkv refuses, each naming what it found:
  bad_rope_longrope.gguf   tiny_phi3.gguf with Phi-3 128k's rope_factors_long/short.weight and
                           phi3.rope.scaling.attn_factor, as llama.cpp's converter writes longrope
  bad_rope_attn_factor.gguf  llama.rope.scaling.attn_factor 0.8 with no scaling type
  bad_rope_type.gguf       llama.rope.scaling.type "dynamic"
  bad_rope_yarn_log.gguf   tiny_qwen2_yarn.gguf with qwen2.rope.scaling.yarn_log_multiplier
  bad_rope_freqs_and_type.gguf  tiny_llama_llama3.gguf with llama.rope.scaling.type "linear" too
  bad_rope_freqs_f16.gguf  tiny_llama_llama3.gguf's rope_freqs.weight stored as F16
  bad_rope_freqs_length.gguf  tiny_llama_llama3.gguf's rope_freqs.weight one factor short
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType
from gguf.quants import dequantize, quantize


def copy_with(src: Path, dst: Path, arch=None, drop=(), retype=None, reshape=None, keys=None,
              tensors=None):
    """Rewrites src into dst: same metadata and tensors except the requested defect. keys adds
    (or replaces) metadata {name: (value, GGUFValueType)}, tensors adds F32 tensors."""
    reader = GGUFReader(src)
    real_arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch or real_arch)
    keys = keys or {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in keys:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        if arch and key.startswith(real_arch + "."):
            key = arch + key[len(real_arch):]
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for key, (value, vtype) in keys.items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name in drop:
            continue
        # Rows first (PyTorch order), float values.
        shape = tuple(int(d) for d in reversed(t.shape))
        values = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if reshape and t.name in reshape:
            values = values[: reshape[t.name]]
        qtype = retype.get(t.name) if retype else None
        if qtype is None:
            qtype = t.tensor_type
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(t.name, values)
        elif qtype == GGMLQuantizationType.F16:
            writer.add_tensor(t.name, values.astype(np.float16))
        elif qtype == GGMLQuantizationType.Q8_1:
            # No quantizer in gguf-py, and the reader refuses the type before any value: zeros.
            block, size = GGML_QUANT_SIZES[qtype]
            data = np.zeros((shape[0], shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            data = quantize(values, qtype)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
    for name, values in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    out = Path(sys.argv[1])
    src = out / "tiny_llama.gguf"
    copy_with(src, out / "bad_missing_tensor.gguf", drop={"blk.1.ffn_up.weight"})
    copy_with(src, out / "bad_unknown_arch.gguf", arch="mamba")
    copy_with(src, out / "bad_tensor_type.gguf", retype={"blk.0.attn_q.weight": GGMLQuantizationType.Q8_1})
    k_rows = next(t for t in GGUFReader(src).tensors if t.name == "blk.0.attn_k.weight").shape[-1]
    copy_with(src, out / "bad_shape.gguf", reshape={"blk.0.attn_k.weight": int(k_rows) - 1})
    # RoPE metadata the loader refuses.
    S, F = GGUFValueType.STRING, GGUFValueType.FLOAT32
    phi3 = out / "tiny_phi3.gguf"
    pairs = int(GGUFReader(phi3).fields["phi3.rope.dimension_count"].contents()) // 2
    copy_with(phi3, out / "bad_rope_longrope.gguf",
              keys={"phi3.rope.scaling.attn_factor": (1.19, F)},
              tensors={"rope_factors_long.weight": np.linspace(1.0, 8.0, pairs),
                       "rope_factors_short.weight": np.ones(pairs)})
    copy_with(src, out / "bad_rope_attn_factor.gguf",
              keys={"llama.rope.scaling.attn_factor": (0.8, F)})
    copy_with(src, out / "bad_rope_type.gguf", keys={"llama.rope.scaling.type": ("dynamic", S)})
    copy_with(out / "tiny_qwen2_yarn.gguf", out / "bad_rope_yarn_log.gguf",
              keys={"qwen2.rope.scaling.yarn_log_multiplier": (0.1, F)})
    llama3 = out / "tiny_llama_llama3.gguf"
    copy_with(llama3, out / "bad_rope_freqs_and_type.gguf",
              keys={"llama.rope.scaling.type": ("linear", S)})
    copy_with(llama3, out / "bad_rope_freqs_f16.gguf",
              retype={"rope_freqs.weight": GGMLQuantizationType.F16})
    freqs = next(t for t in GGUFReader(llama3).tensors if t.name == "rope_freqs.weight")
    copy_with(llama3, out / "bad_rope_freqs_length.gguf", drop={"rope_freqs.weight"},
              tensors={"rope_freqs.weight": np.asarray(freqs.data, dtype=np.float32)[:-1]})

    hf = out / "bad_config_hf"
    shutil.rmtree(hf, ignore_errors=True)
    shutil.copytree(out / "tiny_llama_hf", hf)
    config = json.loads((hf / "config.json").read_text())
    del config["num_hidden_layers"]
    (hf / "config.json").write_text(json.dumps(config, indent=2))
    print(f"bad models written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

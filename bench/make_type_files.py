#!/usr/bin/env python3
"""Makes the shipped model's weights in every type the engine runs, with llama.cpp's own quantizer.

The files are what bench/compare_llamacpp.py and bench/llamacpp_peer_check.py measure on: Q4_0,
Q5_0, Q5_1, Q8_0, Q4_K_M, Q5_K_M, Q6_K and F16, each made from the shipped Q4_1 file
(llama_model_quantize with allow_requantize: the weights are the Q4_1 values requantized, which
changes their quality and not their speed). They go to DIR/SmolLM2-135M-Instruct.<TYPE>.gguf,
never into the repository; a file already there is kept. SmolLM2's 576-wide rows do not divide
into the K-quants' 256-value super-blocks, so in the K files only the 1536-wide FFN down
projections are K-quants and llama.cpp's quantizer falls back to Q5_0 / Q8_0 for the rest (it
prints each fallback).

  make_type_files.py --model Q4_1.gguf --out-dir DIR [--types Q4_0,Q4_K_M]
"""

import argparse
import ctypes
import sys
import time
from pathlib import Path

TYPES = ["Q4_0", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "F16"]


def log(msg: str) -> None:
    print(f"[make_type_files] {msg}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the shipped GGUF (any type)")
    ap.add_argument("--out-dir", type=Path, required=True, help="where the files go")
    ap.add_argument("--types", default=",".join(TYPES), help=f"comma-separated, of {', '.join(TYPES)}")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        log(f"error: unknown type(s) {', '.join(unknown)}; known: {', '.join(TYPES)}")
        return 2
    if not args.model.is_file():
        log(f"error: no model file at {args.model}")
        return 2
    try:
        import llama_cpp
    except ImportError:
        log("error: llama-cpp-python is not installed (deploy/setup.sh --bench installs it)")
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.model.name.split(".")[0]
    for i, name in enumerate(types, 1):
        out = args.out_dir / f"{stem}.{name}.gguf"
        if out.is_file():
            log(f"[{i}/{len(types)}] {out.name} present")
            continue
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
        params.nthread = args.threads
        params.allow_requantize = True
        part = out.with_suffix(".gguf.part")
        start = time.monotonic()
        log(f"[{i}/{len(types)}] making {out.name}")
        rc = llama_cpp.llama_model_quantize(str(args.model).encode(), str(part).encode(),
                                            ctypes.byref(params))
        if rc != 0:
            part.unlink(missing_ok=True)
            log(f"error: llama_model_quantize failed for {name} (return code {rc})")
            return 1
        part.rename(out)
        log(f"[{i}/{len(types)}] {out.name}: {out.stat().st_size / 2**20:.1f} MiB "
            f"in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

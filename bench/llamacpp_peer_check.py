#!/usr/bin/env python3
"""Checks riskkv's model quality against llama.cpp on real English text.

Both engines score the same tokens of text no test tunes to (by default the middle of the GPL-3
licence text): at every position the NLL of the true next token and the argmax prediction. The
check passes when the argmax predictions agree on >= 98% of positions and the mean NLLs differ by
<= 1% (relative). Quantized models make the two engines differ slightly (llama.cpp quantizes
activations to 8 bits inside its quantized matmuls), which is why the bounds are not tighter.

A second, informational statistic compares tokenization: riskkv's tokens for the text window
against llama.cpp's.

riskkv-score contract:
  riskkv-score --model M --tokens-file TOK.json --threads T --out OUT.json
      TOK.json: JSON list of token ids
      OUT.json: {"tokens": [...], "nll": [n-1 floats], "argmax": [n-1 ints], "prefill_seconds": s}
                nll[i] = -log p(tokens[i+1] | tokens[..i]); argmax[i] = argmax of logits at i
  riskkv-score --model M --text-file F --out OUT.json      -> OUT.json has "tokens"

Exit status: 0 PASS, 1 FAIL, 2 usage or run error.
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
MIN_ARGMAX_AGREEMENT_PCT = 98.0
MAX_MEAN_NLL_DIFF_PCT = 1.0


def log(msg: str) -> None:
    print(f"[peer_check] {msg}", file=sys.stderr)


def die(msg: str) -> None:
    """Run errors exit 2, keeping 1 for a completed check that FAILs."""
    log(f"error: {msg}")
    sys.exit(2)


def text_window(path: Path, n_chars: int) -> str:
    """n_chars of text starting at the first paragraph break past the middle of the file.

    The middle avoids the title and preamble, which are the parts any tuning would have seen.
    """
    text = path.read_text(encoding="utf-8")
    start = text.find("\n\n", len(text) // 2)
    start = len(text) // 2 if start < 0 else start + 2
    window = text[start:start + n_chars]
    if len(window) < n_chars // 2:
        die(f"{path} is too short for the requested window")
    return window


def llamacpp_score(model: Path, tokens: list[int], threads: int) -> dict:
    """Per-position next-token NLL and argmax from llama.cpp, plus its evaluation time."""
    from llama_cpp import Llama

    lm = Llama(str(model), n_ctx=len(tokens) + 8, n_batch=512, n_threads=threads,
               n_threads_batch=threads, logits_all=True, verbose=False)
    t0 = time.perf_counter()
    lm.eval(tokens)
    seconds = time.perf_counter() - t0
    logits = np.asarray(lm.scores[: len(tokens) - 1], dtype=np.float64)   # [n-1, vocab]
    z = logits - logits.max(axis=-1, keepdims=True)
    nll = np.log(np.exp(z).sum(axis=-1)) - z[np.arange(len(tokens) - 1), tokens[1:]]
    return {"nll": nll, "argmax": logits.argmax(axis=-1), "seconds": seconds}


def run_riskkv(binary: Path, args: list[str]) -> None:
    cmd = [str(binary), *args]
    log("running " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        die(f"riskkv-score failed with exit status {proc.returncode}")


def tokenization_stats(ours: list[int], ref: list[int]) -> dict:
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    return {"identical": ours == ref, "riskkv_tokens": len(ours), "llamacpp_tokens": len(ref),
            "first_mismatch": None if ours == ref else first_diff,
            "prefix_match_pct": 100.0 * first_diff / max(1, len(ref))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="GGUF model both engines load")
    ap.add_argument("--riskkv-score", type=Path, required=True, help="path to the riskkv-score binary")
    ap.add_argument("--positions", type=int, default=1024, help="tokens to score (default 1024)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("--text-file", type=Path, default=DEFAULT_TEXT,
                    help=f"English text; a window from its middle is used (default {DEFAULT_TEXT})")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    if not args.model.is_file():
        die(f"model {args.model} not found")
    if not args.riskkv_score.is_file():
        die(f"riskkv-score binary {args.riskkv_score} not found (build it first)")
    from llama_cpp import Llama

    # ~4 characters per token in English prose; take enough text and cut the tokens to size.
    window = text_window(args.text_file, args.positions * 6)
    vocab = Llama(str(args.model), vocab_only=True, verbose=False)
    window_tokens = list(vocab.tokenize(window.encode(), add_bos=False, special=False))
    del vocab
    if len(window_tokens) < args.positions:
        die(f"text window has {len(window_tokens)} tokens, {args.positions} requested")
    tokens = window_tokens[: args.positions]

    log(f"llama.cpp scoring {len(tokens)} tokens with {args.threads} threads")
    ref = llamacpp_score(args.model, tokens, args.threads)

    with tempfile.TemporaryDirectory(prefix="peer_check_") as tmp:
        tmp = Path(tmp)
        (tmp / "tokens.json").write_text(json.dumps(tokens))
        (tmp / "window.txt").write_text(window, encoding="utf-8")
        run_riskkv(args.riskkv_score, ["--model", str(args.model), "--tokens-file", str(tmp / "tokens.json"),
                                       "--threads", str(args.threads), "--out", str(tmp / "score.json")])
        ours = json.loads((tmp / "score.json").read_text())
        run_riskkv(args.riskkv_score, ["--model", str(args.model), "--text-file", str(tmp / "window.txt"),
                                       "--out", str(tmp / "text.json")])
        ours_text_tokens = [int(t) for t in json.loads((tmp / "text.json").read_text())["tokens"]]

    n = len(tokens) - 1
    ours_nll = np.asarray(ours["nll"], dtype=np.float64)
    ours_argmax = np.asarray(ours["argmax"], dtype=np.int64)
    if ours_nll.shape != (n,) or ours_argmax.shape != (n,):
        die(f"riskkv-score returned {ours_nll.shape[0]} nll / {ours_argmax.shape[0]} argmax, expected {n}")
    if "tokens" in ours and [int(t) for t in ours["tokens"]] != tokens:
        die("riskkv-score echoed different tokens than it was given")

    agreement = 100.0 * float((ours_argmax == ref["argmax"]).mean())
    ref_mean, ours_mean = float(ref["nll"].mean()), float(ours_nll.mean())
    rel_diff = 100.0 * (ours_mean - ref_mean) / ref_mean
    passed = agreement >= MIN_ARGMAX_AGREEMENT_PCT and abs(rel_diff) <= MAX_MEAN_NLL_DIFF_PCT
    tok = tokenization_stats(ours_text_tokens, window_tokens)
    result = {
        "model": str(args.model.resolve()), "text_file": str(args.text_file), "threads": args.threads,
        "positions_compared": n,
        "argmax_agreement_pct": agreement,
        "mean_nll": {"riskkv": ours_mean, "llamacpp": ref_mean},
        "mean_nll_rel_diff_pct": rel_diff,
        "nll_abs_diff": {"mean": float(np.abs(ours_nll - ref["nll"]).mean()),
                         "max": float(np.abs(ours_nll - ref["nll"]).max())},
        "perplexity": {"riskkv": math.exp(ours_mean), "llamacpp": math.exp(ref_mean)},
        "seconds": {"riskkv_prefill": ours.get("prefill_seconds"), "llamacpp_eval": ref["seconds"]},
        "tokenization": tok,
        "criteria": {"min_argmax_agreement_pct": MIN_ARGMAX_AGREEMENT_PCT,
                     "max_abs_mean_nll_rel_diff_pct": MAX_MEAN_NLL_DIFF_PCT},
        "pass": passed,
    }

    print(f"positions compared      {n}")
    print(f"argmax agreement        {agreement:.2f} %   (need >= {MIN_ARGMAX_AGREEMENT_PCT} %)")
    print(f"mean NLL riskkv         {ours_mean:.5f}   (ppl {math.exp(ours_mean):.3f})")
    print(f"mean NLL llama.cpp      {ref_mean:.5f}   (ppl {math.exp(ref_mean):.3f})")
    print(f"mean NLL rel. diff      {rel_diff:+.3f} %   (need |diff| <= {MAX_MEAN_NLL_DIFF_PCT} %)")
    print(f"tokenization            {'identical' if tok['identical'] else 'DIFFERENT'}: riskkv "
          f"{tok['riskkv_tokens']} vs llama.cpp {tok['llamacpp_tokens']} tokens, "
          f"prefix match {tok['prefix_match_pct']:.1f} %")
    print("PASS" if passed else "FAIL")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

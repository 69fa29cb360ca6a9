#!/usr/bin/env python3
"""Measures riskkv's prefill and decode speed next to llama.cpp's, on the same GGUF and machine.

Several files (--model A B ...; bench/make_type_files.py makes one per weight type) are measured
in one run, one after the other, and summarised per file with a chart of the ratios.
Both sides get the same prompt (the first --prompt-tokens tokens of real English text, tokenized by
llama.cpp), the same thread count, and report medians over --repetitions runs:
  * prefill: time to evaluate the whole prompt in a fresh, empty KV cache (one batch: n_batch and
    n_ubatch >= prompt length on the llama.cpp side);
  * decode: tokens/s of greedy generation, one token per step, right after that prefill;
  * the KV cache in f16 on both sides (llama.cpp's default and the node's; --kv-dtype f32 gives
    both an f32 cache, riskkv-bench's default);
  * peak RSS of the process doing the work (llama.cpp runs in a child process of this script so
    its figure is not mixed with riskkv's; both are taken from wait4's rusage, so llama.cpp's
    includes the Python interpreter and NumPy, some 30 MiB).
Each side gets one untimed warm-up prefill + decode step first.
Timings on a shared machine are noisy: look at all_* values in the JSON before trusting a ratio.

riskkv-bench contract:
  riskkv-bench --model M --prompt-tokens N --decode-tokens M --threads T --repetitions R
      --kv-dtype f16 --json
      prints one JSON object on stdout: {"prefill_seconds": median, "prefill_tokens_per_second": ..,
      "decode_tokens_per_second": .., "peak_rss_bytes": ..}
  The prompt's token ids are passed with --tokens-file (a JSON list) so both engines see identical
  tokens, and riskkv runs once per --activations mode (int8: llama.cpp's arithmetic; f32: exact).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_build import llamacpp_build  # noqa: E402

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")


def log(msg: str) -> None:
    print(f"[compare_llamacpp] {msg}", file=sys.stderr)


def die(msg: str) -> None:
    log(f"error: {msg}")
    sys.exit(2)


def run_measured(cmd: list[str]) -> tuple[str, int]:
    """Runs cmd; returns its stdout and its peak RSS in bytes. Exits on failure."""
    log("running " + " ".join(cmd))
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        sys.stderr.write(stdout[-4000:] + stderr[-4000:])
        die(f"{cmd[0]} failed with exit status {proc.returncode}")
    return stdout, usage.ru_maxrss * 1024  # Linux reports KiB


def parse_json_stdout(stdout: str) -> dict:
    """The JSON object a tool printed, tolerating log lines around it."""
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        for line in reversed(stdout.splitlines()):
            if line.strip().startswith("{"):
                return json.loads(line)
    die(f"no JSON object in output:\n{stdout[-2000:]}")


GGML_TYPE_F32 = 0  # llama.cpp's type_k / type_v value for an f32 KV cache (f16 is its default)


def llamacpp_worker(model: str, tokens: list[int], decode_tokens: int, threads: int, reps: int,
                    kv_dtype: str) -> dict:
    import llama_cpp
    import numpy as np

    n = len(tokens)
    lm = llama_cpp.Llama(model, n_ctx=n + decode_tokens + 8, n_batch=max(512, n), n_ubatch=max(512, n),
                         n_threads=threads, n_threads_batch=threads, verbose=False,
                         **({"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if kv_dtype == "f32" else {}))
    n_vocab = lm.n_vocab()

    def next_token() -> int:
        logits = llama_cpp.llama_get_logits_ith(lm.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())

    def fresh_cache() -> None:
        lm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lm.ctx), True)

    # One untimed prompt + decode step first, as llama-bench does: the first run pays for paging
    # the mmapped weights in and for sizing compute buffers, which is not what we compare.
    fresh_cache()
    lm.eval(tokens)
    lm.eval([next_token()])

    prefill, decode = [], []
    for _ in range(reps):
        fresh_cache()
        t0 = time.perf_counter()
        lm.eval(tokens)
        prefill.append(time.perf_counter() - t0)
        tok = next_token()
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            lm.eval([tok])
            tok = next_token()
        decode.append(decode_tokens / (time.perf_counter() - t0))
    med = statistics.median(prefill)
    return {"prefill_seconds": med, "prefill_tokens_per_second": n / med,
            "decode_tokens_per_second": statistics.median(decode),
            "all_prefill_seconds": prefill, "all_decode_tokens_per_second": decode,
            "llama_cpp_version": getattr(llama_cpp, "__version__", "?"),
            "llama_cpp_build": llamacpp_build()}


# ---------------------------------------------------------------------------------------------


def prompt_tokens(model: Path, text_file: Path, n: int) -> list[int]:
    from llama_cpp import Llama

    vocab = Llama(str(model), vocab_only=True, verbose=False)
    text = text_file.read_text(encoding="utf-8")
    tokens = list(vocab.tokenize(text.encode(), add_bos=False, special=False))
    if len(tokens) < n:
        die(f"{text_file} has only {len(tokens)} tokens, {n} requested")
    return tokens[:n]


def bar_chart(run: dict, args) -> str:
    """One file: grouped bars, prefill and decode tokens/s, each panel on its own scale."""
    colors = {"int8": "#1f77b4", "f32": "#ff7f0e"}
    series = [("llama.cpp", run["llamacpp"], "#888888")] + [
        (f"riskkv {mode}", run["riskkv"][mode], colors[mode]) for mode in args.modes]
    panels = [("prefill_tokens_per_second", f"prefill of {args.prompt_tokens} tokens (tokens/s)"),
              ("decode_tokens_per_second", f"decode, {args.decode_tokens} steps (tokens/s)")]
    width, height, top, bottom, panel_w = 640, 300, 40, 40, 300
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="10" y="18" font-size="14">{run["file"]}, {args.threads} threads, '
           f'median of {args.repetitions}</text>']
    for p, (key, title) in enumerate(panels):
        x0 = 20 + p * (panel_w + 10)
        vmax = max(s[1].get(key) or 0 for s in series) or 1
        out.append(f'<text x="{x0}" y="{top}">{title}</text>')
        bar_w = (panel_w - 40) / len(series)
        for i, (name, data, color) in enumerate(series):
            v = data.get(key) or 0
            h = (height - top - bottom - 30) * v / vmax
            x = x0 + 10 + i * bar_w
            y = height - bottom - h
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 10:.1f}" height="{h:.1f}" fill="{color}"/>')
            out.append(f'<text x="{x + (bar_w - 10) / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle">{v:.1f}</text>')
            out.append(f'<text x="{x + (bar_w - 10) / 2:.1f}" y="{height - bottom + 16}" '
                       f'text-anchor="middle">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def measure(model: Path, args) -> dict:
    """Both engines on one file: prints its table and returns its results."""
    tokens = prompt_tokens(model, args.text_file, args.prompt_tokens)
    with tempfile.TemporaryDirectory(prefix="compare_llamacpp_") as tmp:
        tok_file = Path(tmp) / "tokens.json"
        tok_file.write_text(json.dumps(tokens))
        common = ["--model", str(model), "--decode-tokens", str(args.decode_tokens),
                  "--threads", str(args.threads), "--repetitions", str(args.repetitions)]

        stdout, ref_rss = run_measured([sys.executable, str(Path(__file__).resolve()),
                                        "--llamacpp-worker", str(tok_file), "--kv-dtype", args.kv_dtype,
                                        *common])
        ref = parse_json_stdout(stdout)
        ref["peak_rss_bytes"] = ref_rss

        # riskkv in both activation modes: int8 is llama.cpp's own arithmetic, f32 the exact oracle.
        ours = {}
        for mode in args.modes:
            cmd = [str(args.riskkv_bench), *common, "--prompt-tokens", str(args.prompt_tokens),
                   "--kv-dtype", args.kv_dtype, "--json", "--tokens-file", str(tok_file),
                   "--activations", mode]
            stdout, rss = run_measured(cmd)
            ours[mode] = parse_json_stdout(stdout)
            ours[mode]["peak_rss_bytes_self_reported"] = ours[mode].get("peak_rss_bytes")
            ours[mode]["peak_rss_bytes"] = rss

    metrics = [("prefill_seconds", "prefill seconds", "{:.4f}"),
               ("prefill_tokens_per_second", "prefill tokens/s", "{:.1f}"),
               ("decode_tokens_per_second", "decode tokens/s", "{:.2f}"),
               ("peak_rss_bytes", "peak RSS MiB", None)]

    ratios = {mode: {} for mode in ours}
    print(f"{model.name}: prompt {args.prompt_tokens} tokens, decode {args.decode_tokens}, "
          f"{args.threads} threads, KV {args.kv_dtype} on both sides, median of {args.repetitions}, "
          "same prompt tokens on both sides")
    print(f"llama.cpp {ref.get('llama_cpp_version', '?')}, {ref.get('llama_cpp_build', '?')}")
    header = f"{'':20s} {'llama.cpp':>12s}"
    for mode in ours:
        header += f" {'riskkv ' + mode:>12s}"
    for mode in ours:
        header += f" {mode + '/llama.cpp':>15s}"
    print(header)
    for key, label, fmt in metrics:
        a = ref.get(key)
        row = f"{label:20s} {cell(a, fmt):>12s}"
        for mode in ours:
            row += f" {cell(ours[mode].get(key), fmt):>12s}"
        for mode in ours:
            b = ours[mode].get(key)
            ratios[mode][key] = b / a if a and b is not None else None
            row += f" {cell(ratios[mode][key], '{:.3f}'):>15s}"
        print(row)
    print(flush=True)
    return {"model": str(model.resolve()), "file": model.name, "llamacpp": ref, "riskkv": ours,
            "ratio_riskkv_over_llamacpp": ratios}


def cell(value, fmt) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:.1f}" if fmt is None else fmt.format(value)


def file_label(run: dict) -> str:
    """The weight type in a file name such as SmolLM2-135M-Instruct.Q4_K_M.gguf."""
    parts = run["file"].split(".")
    return parts[-2] if len(parts) >= 3 else run["file"]


def ratio_chart(runs: list[dict], args) -> str:
    """Per file, riskkv int8's prefill and decode speed over llama.cpp's, with the 1.0 line."""
    panels = [("prefill_tokens_per_second", f"prefill of {args.prompt_tokens} tokens"),
              ("decode_tokens_per_second", f"decode, {args.decode_tokens} steps")]
    mode = args.modes[0]
    row_h, top, left, bar_max = 22, 56, 90, 230
    height = top + row_h * len(runs) + 40
    width = left + 2 * (bar_max + 60) + 20
    vmax = max([1.0] + [r["ratio_riskkv_over_llamacpp"][mode].get(k) or 0 for r in runs for k, _ in panels])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="10" y="18" font-size="14">riskkv ({mode}) speed / llama.cpp speed, same file, '
           f'{args.threads} threads, KV {args.kv_dtype}, median of {args.repetitions}</text>']
    for p, (key, title) in enumerate(panels):
        x0 = left + p * (bar_max + 60)
        out.append(f'<text x="{x0}" y="{top - 14}">{title}</text>')
        one = x0 + bar_max / vmax
        out.append(f'<line x1="{one:.1f}" y1="{top - 8}" x2="{one:.1f}" y2="{top + row_h * len(runs)}" '
                   'stroke="#d62728" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{one:.1f}" y="{top + row_h * len(runs) + 14}" text-anchor="middle" '
                   'fill="#d62728">1.0</text>')
        for i, run in enumerate(runs):
            v = run["ratio_riskkv_over_llamacpp"][mode].get(key) or 0
            y = top + i * row_h
            w = bar_max * v / vmax
            color = "#1f77b4" if v >= 1.0 else "#ff7f0e"
            out.append(f'<rect x="{x0}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{color}"/>')
            out.append(f'<text x="{x0 + w + 4:.1f}" y="{y + row_h - 10}">{v:.2f}x</text>')
            if p == 0:
                out.append(f'<text x="{left - 8}" y="{y + row_h - 10}" text-anchor="end">{file_label(run)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, nargs="+", required=True,
                    help="GGUF file(s) both engines load, measured one after the other")
    ap.add_argument("--riskkv-bench", type=Path, help="path to the riskkv-bench binary (required)")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (default 512)")
    ap.add_argument("--decode-tokens", type=int, default=128, help="greedy decode steps (default 128)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("--repetitions", type=int, default=3, help="runs per side; medians reported (default 3)")
    ap.add_argument("--kv-dtype", choices=["f16", "f32"], default="f16",
                    help="both engines' KV cache (default f16, llama.cpp's default)")
    ap.add_argument("--modes", default="int8,f32",
                    help="riskkv activation modes, comma-separated (default int8,f32)")
    ap.add_argument("--text-file", type=Path, default=DEFAULT_TEXT,
                    help=f"English text the prompt is taken from (default {DEFAULT_TEXT})")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--svg", type=Path, help="write a chart (SVG) here")
    ap.add_argument("--llamacpp-worker", type=Path, help=argparse.SUPPRESS)  # internal: tokens JSON
    args = ap.parse_args()

    if args.llamacpp_worker:
        tokens = json.loads(args.llamacpp_worker.read_text())
        print(json.dumps(llamacpp_worker(str(args.model[0]), tokens, args.decode_tokens, args.threads,
                                         args.repetitions, args.kv_dtype)))
        return 0

    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("int8", "f32") for m in args.modes):
        die(f"--modes takes int8 and/or f32, not {','.join(args.modes)!r}")
    for model in args.model:
        if not model.is_file():
            die(f"model {model} not found")
    if args.riskkv_bench is None or not args.riskkv_bench.is_file():
        die(f"riskkv-bench binary {args.riskkv_bench} not found (build it first)")

    runs = []
    for i, model in enumerate(args.model, 1):
        log(f"[{i}/{len(args.model)}] {model.name}")
        runs.append(measure(model, args))

    mode = args.modes[0]
    if len(runs) > 1:
        print(f"riskkv {mode} / llama.cpp, every file, {args.threads} threads, KV {args.kv_dtype}:")
        print(f"{'file':10s} {'prefill tok/s llama.cpp / riskkv':>34s} {'x':>6s} "
              f"{'decode tok/s llama.cpp / riskkv':>33s} {'x':>6s} {'peak RSS MiB llama.cpp / riskkv':>33s}")
        for run in runs:
            ref, ours = run["llamacpp"], run["riskkv"][mode]
            ratio = run["ratio_riskkv_over_llamacpp"][mode]
            prefill = f"{cell(ref.get('prefill_tokens_per_second'), '{:.0f}')} / " \
                      f"{cell(ours.get('prefill_tokens_per_second'), '{:.0f}')}"
            decode = f"{cell(ref.get('decode_tokens_per_second'), '{:.1f}')} / " \
                     f"{cell(ours.get('decode_tokens_per_second'), '{:.1f}')}"
            rss = f"{cell(ref.get('peak_rss_bytes'), None)} / {cell(ours.get('peak_rss_bytes'), None)}"
            print(f"{file_label(run):10s} {prefill:>34s} "
                  f"{cell(ratio.get('prefill_tokens_per_second'), '{:.2f}'):>6s} {decode:>33s} "
                  f"{cell(ratio.get('decode_tokens_per_second'), '{:.2f}'):>6s} {rss:>33s}")
    result = {"prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
              "threads": args.threads, "repetitions": args.repetitions, "kv_dtype": args.kv_dtype,
              "command": sys.argv, "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.svg:
        args.svg.write_text(ratio_chart(runs, args) if len(runs) > 1 else bar_chart(runs[0], args))
        log(f"chart written to {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

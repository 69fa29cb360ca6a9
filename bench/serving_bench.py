#!/usr/bin/env python3
"""Serving many sessions at once: riskkv-node's batching scheduler with real processes, a plain
grpcio client (server reflection, no stubs) and llama.cpp's batched decode in the same run.

Every node runs `--threads 2 --kv-dtype f16 --backend cpu` plus the scheduler flags its scenario
names. The phases run one after another, never two loads at once:

 1. Concurrency sweep: N sessions (N in 1, 2, 4, 8, 16) start with distinct ~130-token windows of
    real English text (the GPL-3), then N Generate streams of 96 tokens start together (one client
    thread each). Aggregate tokens/s = every token / (first stream's start to last stream's end);
    per stream: tokens/s, the gaps between its tokens as the client saw them (median, p99, worst)
    and its time to first token. The node's batch histograms say how many items its steps ran.
 2. llama.cpp (llama-cpp-python's low-level API, in a child process while no node runs): the same
    GGUF and prompts, n_threads 2, N sequences prefilled, then 96 steps of one llama_decode with
    one token per sequence, greedy argmax of llama_get_logits_ith. Skipped when not installed.
 3. Long prompt during decodes: 8 sessions decoding, then a StartSession of a 2,000-token prompt.
    The worst gap of the 8 streams while it prefills, against one chunk's time: the mean of
    riskkv_batch_step_seconds over the steps that ran during the prompt (each carries one chunk
    and the decodes), beside the StartSession latency of one --prefill-chunk prompt on the idle
    node. With the default chunking and without (--prefill-chunk 2048 --batch-tokens 2048).
 4. Live hand-over into a busy node: a session with a ~500-token history generating on node A
    migrates live (RECONSTRUCT with the shipped policy, FULL_KV plain, int8 and int4, TOKEN_REPLAY)
    to node B, idle and then serving 8 decoding streams;
    MigrateReply.downtime_seconds, medians over --reps. The client follows the stream's `moved`
    to B, which gives the gap its caller saw as well.

    serving_bench.py BIN_DIR MODEL [--out DIR] [--quick] [--reps R]

Writes DIR/serving_bench.json (every figure and the raw timings) and DIR/serving_bench.svg, shows
progress on stderr and prints a Markdown summary with the goals' PASS/FAIL to stdout. Exit status:
0 when every goal passes, 1 when one fails, 2 on an error.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_build import llamacpp_build  # noqa: E402
from node_client import NodeProcess, histogram_delta, histogram_max_range  # noqa: E402

TEXT = Path("/usr/share/common-licenses/GPL-3")
NODE_FLAGS = ["--threads", "2", "--kv-dtype", "f16", "--backend", "cpu"]
UNCHUNKED = ["--prefill-chunk", "2048", "--batch-tokens", "2048"]
# The hand-over's modes: the product's RECONSTRUCT (the shipped SmolLM2 policy, int4 with 6 of
# 30 layers rebuilt) beside full KV, int8 and int4 KV alone and token replay; MODE[:FULL_KV's wire
# form].
HANDOVER_MODES = ["RECONSTRUCT", "FULL_KV", "FULL_KV:int8", "FULL_KV:int4", "TOKEN_REPLAY"]
POLICY_DIR = Path(__file__).resolve().parent.parent / "deploy/policies/smollm2-135m-instruct"
POLICY_FLAGS = ["--policy", str(POLICY_DIR / "policy.pb"), "--bank", str(POLICY_DIR / "bank.rkvbank")]
T0 = time.time()


def log(msg):
    print("[serving_bench %6.1f s] %s" % (time.time() - T0, msg), file=sys.stderr, flush=True)


class MachineLoad:
    """CPU time the whole machine spent against what this script and its (waited-for) children
    spent, per phase: a phase that another process shared is marked, as its figures are not this
    script's alone. Every phase stops its nodes before it ends, so their time is counted."""

    def __init__(self):
        self.phases = []
        self._mark = self._now()

    @staticmethod
    def _now():
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        busy = (sum(cpu[:8]) - cpu[3] - cpu[4]) / hz  # everything but idle and iowait
        t = os.times()
        return {"wall": time.time(), "busy": busy, "steal": cpu[7] / hz,
                "own": t.user + t.system + t.children_user + t.children_system}

    def phase(self, name):
        now = self._now()
        d = {k: now[k] - self._mark[k] for k in now}
        foreign = max(d["busy"] - d["own"], 0.0)
        r = {"phase": name, "wall_seconds": d["wall"], "machine_busy_cpu_seconds": d["busy"],
             "own_cpu_seconds": d["own"], "foreign_cpu_seconds": foreign,
             "steal_seconds": d["steal"],
             "foreign_share": foreign / max(d["wall"] * os.cpu_count(), 1e-9)}
        self.phases.append(r)
        self._mark = now
        level = "WARNING: " if r["foreign_share"] > 0.05 else ""
        log("%s%s: %.0f s, other processes used %.1f CPU-s (%.0f%% of the machine), steal %.1f s"
            % (level, name, d["wall"], foreign, 100 * r["foreign_share"], d["steal"]))
        return r


def pct(values, q):
    """q-th percentile, linear between closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


class Stream(threading.Thread):
    """One Generate stream on its own thread, every token's arrival timed on the client.

    follow: {address: NodeClient}; a stream whose session moved goes on there for `follow_tokens`
    tokens (then stops), so the gap between the last token on the source and the first on the
    target is the caller's view of the hand-over."""

    def __init__(self, client, sid, max_tokens, barrier=None, follow=None, follow_tokens=8):
        super().__init__(daemon=True)
        self.client, self.sid, self.max_tokens = client, sid, max_tokens
        self.barrier, self.follow, self.follow_tokens = barrier, follow or {}, follow_tokens
        self.times, self.moved, self.followed, self.error = [], None, [], None
        self.t_call = self.t_end = None
        self._lock, self._stopped, self._call = threading.Lock(), False, None

    def _open(self, client, sid, n):
        with self._lock:
            if self._stopped:
                return None
            self._call = client.generate(sid, n)
            return self._call

    def run(self):
        import grpc
        try:
            if self.barrier is not None:
                self.barrier.wait()
            self.t_call = time.perf_counter()
            call = self._open(self.client, self.sid, self.max_tokens)
            for reply in call or ():
                if reply.HasField("moved"):
                    self.moved = {"t": time.perf_counter(), "address": reply.moved.target_address,
                                  "session_id": reply.moved.session_id,
                                  "remaining": reply.moved.remaining_tokens}
                    break
                self.times.append(time.perf_counter())
            if self.moved and self.moved["address"] in self.follow:
                target = self.follow[self.moved["address"]]
                call = self._open(target, self.moved["session_id"],
                                  min(self.follow_tokens, self.moved["remaining"]))
                for _ in call or ():
                    self.followed.append(time.perf_counter())
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = "%s: %s" % (e.code().name, e.details())
        except Exception as e:  # reported with the figures, the run goes on
            self.error = repr(e)
        self.t_end = time.perf_counter()

    def stop(self):
        with self._lock:
            self._stopped = True
            if self._call is not None:
                self._call.cancel()

    def gaps(self):
        return [b - a for a, b in zip(self.times, self.times[1:])]


def close_quietly(client, sid, tries=50):
    """CloseSession, retried while a just-cancelled Generate still holds the session."""
    import grpc
    for _ in range(tries):
        try:
            client.close(sid)
            return True
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return False
            time.sleep(0.1)
    log("could not close session %s" % sid)
    return False


def start_streams(client, sids, max_tokens, wait_tokens=3, timeout=120):
    """Long streams that keep their sessions decoding until stopped; returns once each has
    delivered wait_tokens tokens."""
    streams = [Stream(client, sid, max_tokens) for sid in sids]
    for s in streams:
        s.start()
    deadline = time.time() + timeout
    while any(len(s.times) < wait_tokens for s in streams):
        if time.time() > deadline or any(s.error for s in streams):
            raise RuntimeError("background streams did not start: %s"
                               % [s.error for s in streams if s.error])
        time.sleep(0.02)
    return streams


def stop_streams(client, streams):
    for s in streams:
        s.stop()
    for s in streams:
        s.join(timeout=60)
    for s in streams:
        close_quietly(client, s.sid)


def warm_up(client, prompt):
    sid = client.start(token_ids=prompt)["sessionId"]
    for _ in client.generate(sid, 4):
        pass
    client.close(sid)


def tokenize(client, need):
    """Token ids of the GPL-3's text, at least `need` of them, as the node's tokenizer makes them
    (the node prefills them once, which warms it up too)."""
    text = TEXT.read_text(encoding="utf-8")
    chars = need * 5
    while True:
        sid = client.start(prompt=text[:chars])["sessionId"]
        ids = client.session(sid, with_tokens=True).get("tokenIds", [])
        client.close(sid)
        if len(ids) >= need or chars >= len(text):
            return ids
        chars = int(chars * 1.3)


# ---------------------------------------------------------------------------------------------
# 1. Concurrency sweep


SWEEP_FIGURES = ("aggregate_tokens_per_second", "wall_seconds", "stream_tokens_per_second_median",
                 "gap_median_seconds", "gap_p99_worst_seconds", "gap_max_seconds",
                 "ttft_median_seconds", "ttft_max_seconds", "batch_items_mean",
                 "batch_tokens_mean", "batch_step_mean_seconds", "node_itl_mean_seconds",
                 "node_ttft_mean_seconds")


def sweep_round(node, client, prompts, n, tokens):
    sids = [client.start(token_ids=p)["sessionId"] for p in prompts[:n]]
    barrier = threading.Barrier(n)
    streams = [Stream(client, sid, tokens, barrier) for sid in sids]
    m0 = node.metrics()
    for s in streams:
        s.start()
    for s in streams:
        s.join()
    m1 = node.metrics()
    for sid in sids:
        close_quietly(client, sid)
    per_stream = []
    for s in streams:
        g = s.gaps()
        per_stream.append({
            "tokens": len(s.times), "seconds": s.t_end - s.t_call,
            "tokens_per_second": len(s.times) / (s.t_end - s.t_call),
            "ttft_seconds": s.times[0] - s.t_call if s.times else None,
            "gap_median_seconds": pct(g, 50), "gap_p99_seconds": pct(g, 99),
            "gap_max_seconds": max(g) if g else None, "gaps_seconds": g})
    hist = {name: histogram_delta(m0, m1, name)[2] for name in (
        "riskkv_batch_items", "riskkv_batch_tokens", "riskkv_batch_step_seconds",
        "riskkv_inter_token_latency_seconds", "riskkv_time_to_first_token_seconds")}
    total = sum(len(s.times) for s in streams)
    wall = max(s.t_end for s in streams) - min(s.t_call for s in streams)
    return {"tokens": total, "wall_seconds": wall, "aggregate_tokens_per_second": total / wall,
            "errors": [s.error for s in streams if s.error], "streams": per_stream,
            "steps": histogram_delta(m0, m1, "riskkv_batch_items")[0],
            "generated_tokens_total_delta": m1.get("riskkv_generated_tokens_total", 0)
            - m0.get("riskkv_generated_tokens_total", 0),
            "stream_tokens_per_second_median": median(p["tokens_per_second"] for p in per_stream),
            "gap_median_seconds": median(p["gap_median_seconds"] for p in per_stream),
            "gap_p99_worst_seconds": max((p["gap_p99_seconds"] or 0) for p in per_stream),
            "gap_max_seconds": max((p["gap_max_seconds"] or 0) for p in per_stream),
            "ttft_median_seconds": median(p["ttft_seconds"] for p in per_stream),
            "ttft_max_seconds": max((p["ttft_seconds"] or 0) for p in per_stream),
            "batch_items_mean": hist["riskkv_batch_items"],
            "batch_items_max_range": histogram_max_range(m0, m1, "riskkv_batch_items"),
            "batch_step_seconds_max_range": histogram_max_range(m0, m1,
                                                                "riskkv_batch_step_seconds"),
            "batch_tokens_mean": hist["riskkv_batch_tokens"],
            "batch_step_mean_seconds": hist["riskkv_batch_step_seconds"],
            "node_itl_mean_seconds": hist["riskkv_inter_token_latency_seconds"],
            "node_ttft_mean_seconds": hist["riskkv_time_to_first_token_seconds"]}


def sweep(node, prompts, ns, tokens, reps):
    """Per N, `reps` rounds; each figure is the median over the rounds (all rounds kept)."""
    client = node.client()
    results = []
    for n in ns:
        rounds = []
        for rep in range(reps):
            r = sweep_round(node, client, prompts, n, tokens)
            rounds.append(r)
            log("N=%d round %d: %.1f tokens/s in all, %.1f per stream, gap p50 %.1f ms, worst p99 "
                "%.1f ms, %.2f items a step%s" % (
                    n, rep + 1, r["aggregate_tokens_per_second"],
                    r["stream_tokens_per_second_median"], 1e3 * (r["gap_median_seconds"] or 0),
                    1e3 * r["gap_p99_worst_seconds"], r["batch_items_mean"] or 0,
                    ", errors: %s" % r["errors"] if r["errors"] else ""))
        summary = {k: median(r[k] for r in rounds) for k in SWEEP_FIGURES}
        summary.update({"n": n, "rounds": rounds,
                        "errors": [e for r in rounds for e in r["errors"]],
                        "gap_p99_worst_over_rounds_seconds": max(r["gap_p99_worst_seconds"]
                                                                 for r in rounds)})
        results.append(summary)
    return results


# ---------------------------------------------------------------------------------------------
# 2. llama.cpp's batched decode (child process)


def llamacpp_worker(model, prompts, ns, decode_tokens, threads, reps):
    import llama_cpp
    import numpy as np

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    lm = llama_cpp.llama_model_load_from_file(model.encode(), mparams)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(lm))
    max_n = max(ns)
    per_seq = (max(len(p) for p in prompts) + decode_tokens + 8 + 255) // 256 * 256
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = per_seq * max_n
    cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_seq_max = max_n
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(lm, cparams)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    mem = llama_cpp.llama_get_memory(ctx)

    def decode(items):  # [(token, pos, seq, logits)]
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, want
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError("llama_decode returned %d" % rc)

    def argmax(i):
        logits = llama_cpp.llama_get_logits_ith(ctx, i)
        return int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())

    def run(n, steps):
        llama_cpp.llama_memory_clear(mem, True)
        nxt, pos = [], []
        t0 = time.perf_counter()
        for s in range(n):
            p = prompts[s]
            decode([(tok, i, s, i == len(p) - 1) for i, tok in enumerate(p)])
            nxt.append(argmax(len(p) - 1))
            pos.append(len(p))
        prefill = time.perf_counter() - t0
        stamps = [time.perf_counter()]
        for _ in range(steps):
            decode([(nxt[s], pos[s], s, True) for s in range(n)])
            for s in range(n):
                nxt[s] = argmax(s)
                pos[s] += 1
            stamps.append(time.perf_counter())
        step = [b - a for a, b in zip(stamps, stamps[1:])]
        wall = stamps[-1] - stamps[0]
        return {"n": n, "prefill_seconds": prefill, "decode_seconds": wall,
                "aggregate_tokens_per_second": n * steps / wall,
                "step_median_seconds": pct(step, 50), "step_p99_seconds": pct(step, 99),
                "step_max_seconds": max(step), "steps_seconds": step}

    run(1, 8)  # untimed: pages the weights in and sizes the compute buffers
    out = []
    for n in ns:
        rounds = [run(n, decode_tokens) for _ in range(reps)]
        summary = {k: statistics.median(r[k] for r in rounds) for k in (
            "prefill_seconds", "decode_seconds", "aggregate_tokens_per_second",
            "step_median_seconds", "step_p99_seconds", "step_max_seconds")}
        summary.update({"n": n, "rounds": rounds})
        out.append(summary)
    llama_cpp.llama_batch_free(batch)
    params = {k: getattr(cparams, k) for k in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max",
                                                "n_threads", "kv_unified", "flash_attn_type")
              if hasattr(cparams, k)}
    params["type_k"], params["type_v"] = cparams.type_k, cparams.type_v
    return {"version": getattr(llama_cpp, "__version__", "?"), "build": llamacpp_build(),
            "context_params": params, "results": out}


def llamacpp(model, prompts, ns, tokens, reps, tmp):
    try:
        subprocess.run([sys.executable, "-c", "import llama_cpp"], check=True,
                       capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        log("llama-cpp-python is not installed in %s: the llama.cpp comparison is skipped"
            % sys.executable)
        return None
    spec = os.path.join(tmp, "llamacpp.json")
    with open(spec, "w") as f:
        json.dump({"model": model, "prompts": prompts[:max(ns)], "ns": ns, "tokens": tokens,
                   "reps": reps}, f)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llamacpp-worker", spec],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        log("llama.cpp worker failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
        return {"error": r.stderr[-2000:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for x in out["results"]:
        log("llama.cpp N=%d: %.1f tokens/s in all, step p50 %.1f ms" % (
            x["n"], x["aggregate_tokens_per_second"], 1e3 * x["step_median_seconds"]))
    return out


# ---------------------------------------------------------------------------------------------
# 3. A long prompt arrives while sessions decode


LONG_PROMPT_FIGURES = ("prefill_seconds", "steps_during_prompt", "step_mean_seconds",
                       "batch_tokens_mean", "batch_items_mean", "worst_gap_seconds",
                       "gap_median_before_seconds")


def long_prompt_round(node, client, prompts, long_ids, decoders):
    sids = [client.start(token_ids=p)["sessionId"] for p in prompts[:decoders]]
    streams = start_streams(client, sids, 4000, wait_tokens=5)
    time.sleep(1.0)
    m0 = node.metrics()
    t0 = time.perf_counter()
    big = client.start(token_ids=long_ids)
    t1 = time.perf_counter()
    m1 = node.metrics()
    time.sleep(1.0)
    stop_streams(client, streams)
    close_quietly(client, big["sessionId"])
    worst, before = 0.0, []
    for s in streams:
        for a, b in zip(s.times, s.times[1:]):
            if b > t0 and a < t1:
                worst = max(worst, b - a)
            elif b <= t0:
                before.append(b - a)
    steps, _, step_mean = histogram_delta(m0, m1, "riskkv_batch_step_seconds")
    waits = {}
    for (name, labels), _ in m1.labelled.items():
        if name == "riskkv_queue_wait_seconds_count":
            waits[labels] = histogram_delta(m0, m1, "riskkv_queue_wait_seconds", labels)[2]
    r = {"prefill_seconds": t1 - t0, "steps_during_prompt": steps, "step_mean_seconds": step_mean,
         "step_seconds_max_range": histogram_max_range(m0, m1, "riskkv_batch_step_seconds"),
         "batch_tokens_max_range": histogram_max_range(m0, m1, "riskkv_batch_tokens"),
         "batch_tokens_mean": histogram_delta(m0, m1, "riskkv_batch_tokens")[2],
         "batch_items_mean": histogram_delta(m0, m1, "riskkv_batch_items")[2],
         "queue_wait_mean_seconds": waits, "worst_gap_seconds": worst,
         "gap_median_before_seconds": pct(before, 50),
         "errors": [s.error for s in streams if s.error]}
    log("prompt of %d tokens: prefill %.2f s in %d steps of %.1f ms (largest %s ms, %s tokens), "
        "worst decode gap %.1f ms (before it: %.1f ms)" % (
            len(long_ids), r["prefill_seconds"], steps, 1e3 * (step_mean or 0),
            rng(r["step_seconds_max_range"], 1e3), rng(r["batch_tokens_max_range"]), 1e3 * worst,
            1e3 * (r["gap_median_before_seconds"] or 0)))
    return r


def long_prompt(node, prompts, long_ids, decoders, chunk, reps, reps_alone=3):
    """chunk: the length of the idle node's one-chunk prompt (the default --prefill-chunk on both
    nodes, so their rows compare; the unchunked node's real chunk is the whole prompt). Figures
    are medians over `reps` rounds."""
    client = node.client()
    alone = []
    for i in range(reps_alone):  # one chunk's prefill on the idle node
        t = time.perf_counter()
        sid = client.start(token_ids=long_ids[i * 7:i * 7 + chunk])["sessionId"]
        alone.append(time.perf_counter() - t)
        client.close(sid)
    rounds = [long_prompt_round(node, client, prompts, long_ids, decoders) for _ in range(reps)]
    r = {k: median(x[k] for x in rounds) for k in LONG_PROMPT_FIGURES}
    r.update({"prompt_tokens": len(long_ids), "decoders": decoders, "rounds": rounds,
              "chunk_alone_tokens": chunk, "chunk_alone_seconds": median(alone),
              "chunk_alone_all_seconds": alone,
              "worst_gap_max_over_rounds_seconds": max(x["worst_gap_seconds"] for x in rounds),
              "errors": [e for x in rounds for e in x["errors"]]})
    return r


# ---------------------------------------------------------------------------------------------
# 4. Live hand-over into an idle and a busy node


def handover(a, b, prompts, history, modes, reps, decoders, log_name):
    ca, cb = a.client(), b.client()
    follow = {b.addr: cb}
    out = {}
    for busy in (False, True):
        background = []
        if busy:
            sids = [cb.start(token_ids=p)["sessionId"] for p in prompts[:decoders]]
            background = start_streams(cb, sids, 4000, wait_tokens=3)
        for mode in modes:
            runs = []
            for rep in range(reps):
                hist = history[(rep % 4) * 11:]
                sid = ca.start(token_ids=hist[:len(history) - 3 * 11])["sessionId"]
                s = Stream(ca, sid, 3000, follow=follow)
                s.start()
                while len(s.times) < 8 and s.is_alive():
                    time.sleep(0.01)
                m0, mb0 = a.metrics(), b.metrics()
                t = time.perf_counter()
                kind, _, form = mode.partition(":")
                reply = ca.migrate(sid, b.addr, kind, live=True, wire_form=form or None)
                t_done = time.perf_counter()
                call_s = t_done - t
                m1, mb1 = a.metrics(), b.metrics()
                s.join(timeout=60)
                if s.is_alive():
                    s.stop()
                    s.join()
                gaps = s.gaps()
                run = {"downtime_seconds": float(reply.get("downtimeSeconds", 0)),
                       "total_seconds": float(reply.get("totalSeconds", 0)),
                       "migrate_call_seconds": call_s, "live": reply.get("live", False),
                       "mode": reply.get("mode"), "precopy_rounds": reply.get("precopyRounds", 0),
                       "history_tokens": int(reply.get("historyTokens", 0)),
                       "kv_bytes_before_pause": int(reply.get("kvBytesBeforePause", 0)),
                       "kv_bytes_after_pause": int(reply.get("kvBytesAfterPause", 0)),
                       "downtime_histogram_seconds": histogram_delta(
                           m0, m1, "riskkv_migration_downtime_seconds")[2],
                       "tokens_on_source": len(s.times),
                       "source_gap_median_seconds": pct(gaps, 50),
                       "client_handover_gap_seconds": (s.followed[0] - s.times[-1])
                       if s.followed and s.times else None,
                       "stream_error": s.error,
                       # B's own decodes while the migration ran (busy only)
                       "background_worst_gap_seconds": max(
                           [y - x for bg in background for x, y in zip(bg.times, bg.times[1:])
                            if y > t and x < t_done] or [None]) if background else None,
                       "target_steps": histogram_delta(mb0, mb1, "riskkv_batch_step_seconds")[0],
                       "target_step_mean_seconds": histogram_delta(
                           mb0, mb1, "riskkv_batch_step_seconds")[2],
                       "target_batch_tokens_mean": histogram_delta(
                           mb0, mb1, "riskkv_batch_tokens")[2],
                       "target_batch_tokens_max_range": histogram_max_range(
                           mb0, mb1, "riskkv_batch_tokens"),
                       "target_step_seconds_max_range": histogram_max_range(
                           mb0, mb1, "riskkv_batch_step_seconds")}
                if s.moved:
                    close_quietly(cb, s.moved["session_id"])
                else:
                    close_quietly(ca, sid)
                runs.append(run)
                log("%s %s -> %s B: downtime %.1f ms (rounds %s, history %d, total %.2f s), "
                    "caller's gap %s ms; B meanwhile: decodes' worst gap %s ms, largest step "
                    "%s ms, %s tokens" % (
                        log_name, mode, "busy" if busy else "idle",
                        1e3 * run["downtime_seconds"], run["precopy_rounds"],
                        run["history_tokens"], run["total_seconds"],
                        ms(run["client_handover_gap_seconds"]),
                        ms(run["background_worst_gap_seconds"]),
                        rng(run["target_step_seconds_max_range"], 1e3),
                        rng(run["target_batch_tokens_max_range"])))
            out["%s/%s" % (mode, "busy" if busy else "idle")] = {
                "runs": runs,
                "downtime_median_seconds": median(r["downtime_seconds"] for r in runs),
                "background_worst_gap_median_seconds": median(
                    r["background_worst_gap_seconds"] for r in runs),
                "client_gap_median_seconds": median(r["client_handover_gap_seconds"] for r in runs),
                "total_median_seconds": median(r["total_seconds"] for r in runs)}
        if background:
            bg_gaps = [g for s in background for g in s.gaps()]
            out["busy_background"] = {"streams": len(background),
                                      "gap_median_seconds": pct(bg_gaps, 50),
                                      "gap_max_seconds": max(bg_gaps) if bg_gaps else None,
                                      "errors": [s.error for s in background if s.error]}
            stop_streams(cb, background)
    return out


# ---------------------------------------------------------------------------------------------
# Report


def rng(r, scale=1.0, unit=""):
    """A histogram's (lo, hi] bucket as text."""
    if not r:
        return "n/a"
    return "%.4g-%.4g%s" % (r[0] * scale, r[1] * scale, unit)


def ms(v):
    return "n/a" if v is None else "%.1f" % (1e3 * v)


def ratio(a, b):
    return None if a is None or not b else a / b


def fx(v, digits=2):
    return "n/a" if v is None else "%.*f" % (digits, v)


def goals_and_table(res):
    lines, goals = [], []
    sw = res["sweep"]
    one = next(r for r in sw if r["n"] == 1)
    alone_gap = one["gap_median_seconds"]
    lc = {x["n"]: x for x in (res.get("llamacpp") or {}).get("results", [])}
    lines.append("### 1. Concurrency sweep (%d tokens a stream, prompts of ~%d tokens, "
                 "medians of %d rounds)" % (res["config"]["tokens"], res["config"]["prompt_tokens"],
                                           res["config"]["reps"]))
    lines.append("")
    lines.append("Gaps are client-side; 'worst p99' is the p99 of a round's worst stream; 'items a "
                 "step' is the mean of riskkv_batch_items over the round's steps.")
    lines.append("")
    lines.append("| N | riskkv tok/s | x N=1 | tok/s per stream | gap p50 ms | worst p99 ms | "
                 "worst gap ms | worst p99 / alone gap | TTFT p50 ms | items a step | "
                 "llama.cpp tok/s | riskkv / llama.cpp |")
    lines.append("|" + "---|" * 12)
    for r in sw:
        agg = r["aggregate_tokens_per_second"]
        l_agg = lc.get(r["n"], {}).get("aggregate_tokens_per_second")
        r["x_one"] = agg / one["aggregate_tokens_per_second"]
        r["p99_over_alone_gap"] = ratio(r["gap_p99_worst_seconds"], alone_gap)
        r["over_llamacpp"] = ratio(agg, l_agg)
        lines.append("| %d | %.1f | %.2f | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["n"], agg, r["x_one"], r["stream_tokens_per_second_median"],
            ms(r["gap_median_seconds"]), ms(r["gap_p99_worst_seconds"]),
            ms(r["gap_max_seconds"]), fx(r["p99_over_alone_gap"]), ms(r["ttft_median_seconds"]),
            fx(r["batch_items_mean"]), fx(l_agg, 1), fx(r["over_llamacpp"])))
    for n, want in ((8, 4.0), (16, 5.0)):
        r = next((r for r in sw if r["n"] == n), None)
        if r:
            goals.append(("N=%d aggregate >= %.0fx N=1" % (n, want), r["x_one"] >= want,
                          "%.2fx" % r["x_one"]))
    for r in sw:
        worst = r["gap_p99_worst_over_rounds_seconds"]
        goals.append(("N=%d every stream's p99 gap <= 3x the alone median gap (%s ms)"
                      % (r["n"], ms(alone_gap)), worst <= 3.0 * alone_gap,
                      "worst p99 of every round %s ms = %.2fx (median round %.2fx)"
                      % (ms(worst), worst / alone_gap, r["p99_over_alone_gap"])))
    for r in sw:
        if r["over_llamacpp"] is not None:
            goals.append(("N=%d riskkv / llama.cpp aggregate >= 1.0x" % r["n"],
                          r["over_llamacpp"] >= 1.0, "%.2fx" % r["over_llamacpp"]))
    if lc:
        lines.append("")
        lines.append("llama.cpp (llama-cpp-python %s, %s) is an in-process loop of llama_decode calls; "
                     "riskkv's figure goes through gRPC to a separate process, with a Python "
                     "client "
                     "on the same 2 cores. llama.cpp's step p50/p99 ms by N: %s." % (
                         res["llamacpp"]["version"], res["llamacpp"].get("build", "?"), ", ".join(
                             "%d: %s/%s" % (n, ms(x["step_median_seconds"]),
                                            ms(x["step_p99_seconds"]))
                             for n, x in sorted(lc.items()))))
    elif "llamacpp_skipped" in res:
        lines.append("")
        lines.append("llama.cpp: %s" % res["llamacpp_skipped"])

    lp = res["long_prompt"]
    chunked = lp["chunked"]
    chunk_time = chunked["step_mean_seconds"]
    lines.append("")
    lines.append("### 2. A %d-token prompt arrives while %d sessions decode (medians of %d)"
                 % (chunked["prompt_tokens"], chunked["decoders"], res["config"]["reps"]))
    lines.append("")
    lines.append("| node | prefill s | steps | step mean ms (one chunk's time) | largest step ms "
                 "(bucket) | tokens a step | chunk alone ms | gap before ms | worst gap ms | "
                 "worst / own step mean | worst / chunked step mean |")
    lines.append("|" + "---|" * 11)
    for name, flags in (("chunked", "default flags"), ("unchunked", " ".join(UNCHUNKED))):
        r = lp[name]
        big = [x["step_seconds_max_range"] for x in r["rounds"] if x["step_seconds_max_range"]]
        lines.append("| %s (%s) | %.2f | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, flags, r["prefill_seconds"], r["steps_during_prompt"], ms(r["step_mean_seconds"]),
            rng(max(big) if big else None, 1e3),
            fx(r["batch_tokens_mean"], 1), ms(r["chunk_alone_seconds"]),
            ms(r["gap_median_before_seconds"]), ms(r["worst_gap_seconds"]),
            fx(ratio(r["worst_gap_seconds"], r["step_mean_seconds"])),
            fx(ratio(r["worst_gap_seconds"], chunk_time))))
    lines.append("")
    lines.append("One chunk's time = mean of riskkv_batch_step_seconds over the steps that ran "
                 "while "
                 "the prompt prefilled (each step: one chunk of --prefill-chunk tokens plus every "
                 "waiting decode); 'chunk alone' = StartSession latency of a prompt of one chunk "
                 "on "
                 "the idle node, through gRPC (median of 3). The goal uses the step mean.")
    worst = chunked["worst_gap_max_over_rounds_seconds"]
    g = ratio(worst, chunk_time)
    goals.append(("chunked: worst decode gap during the prompt <= 2x one chunk's time",
                  g is not None and g <= 2.0, "worst of every round %s ms / %s ms = %s (median "
                  "round %s); unchunked: %s ms = %s" % (
                      ms(worst), ms(chunk_time), fx(g),
                      fx(ratio(chunked["worst_gap_seconds"], chunk_time)),
                      ms(lp["unchunked"]["worst_gap_max_over_rounds_seconds"]),
                      fx(ratio(lp["unchunked"]["worst_gap_max_over_rounds_seconds"], chunk_time)))))

    ho = res["handover"]
    lines.append("")
    lines.append("### 3. Live hand-over of a ~%d-token session into node B (medians of %d)"
                 % (res["config"]["history_tokens"], res["config"]["handover_reps"]))
    lines.append("")
    lines.append("| mode | B | downtime ms | all downtimes ms | total s | caller's gap ms | "
                 "pre-copy rounds | B's decodes' worst gap during it ms |")
    lines.append("|" + "---|" * 8)
    for mode in res["config"]["modes"]:
        for state in ("idle", "busy"):
            r = ho["%s/%s" % (mode, state)]
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                mode, state, ms(r["downtime_median_seconds"]),
                ", ".join(ms(x["downtime_seconds"]) for x in r["runs"]),
                fx(r["total_median_seconds"], 3), ms(r["client_gap_median_seconds"]),
                ", ".join(str(x["precopy_rounds"]) for x in r["runs"]),
                ", ".join(ms(x["background_worst_gap_seconds"]) for x in r["runs"])
                if state == "busy" else "-"))
        idle = ho["%s/idle" % mode]["downtime_median_seconds"]
        busy = ho["%s/busy" % mode]["downtime_median_seconds"]
        q = ratio(busy, idle)
        goals.append(("%s: busy downtime <= 2x idle downtime" % mode, q is not None and q <= 2.0,
                      "%s ms / %s ms = %s" % (ms(busy), ms(idle), fx(q))))
    bg = ho.get("busy_background")
    if bg:
        lines.append("")
        lines.append("Downtime: MigrateReply.downtime_seconds (the source's pause to the target's "
                     "commit); caller's gap: the client's last token from A to its first from B, "
                     "following the stream's `moved`. A and B share the machine's 2 cores.")
        lines.append("")
        lines.append("B's %d background streams through the busy phase: gap p50 %s ms, "
                     "worst %s ms." % (
            bg["streams"], ms(bg["gap_median_seconds"]), ms(bg["gap_max_seconds"])))
    shared = [p for p in res.get("machine_load", []) if p["foreign_share"] > 0.05]
    lines.append("")
    lines.append("Other processes on the machine: " + ("; ".join(
        "%s %.0f%% (%.1f CPU-s)" % (p["phase"], 100 * p["foreign_share"], p["foreign_cpu_seconds"])
        for p in shared) + " -- those figures are not this run's alone" if shared else
        "none above 5% of the CPU in any phase."))
    lines.append("")
    lines.append("### Goals")
    lines.append("")
    for name, ok, detail in goals:
        lines.append("- %s %s: %s" % ("PASS" if ok else "FAIL", name, detail))
    return "\n".join(lines), goals


def svg_line_panel(x0, y0, w, h, title, xs, series, ylabel):
    """series: [(label, colour, dash, [y or None per x])]; x at even steps (N is 1, 2, 4, ...)."""
    ymax = max([v for _, _, _, ys in series for v in ys if v is not None] + [1e-9]) * 1.15
    px = lambda i: x0 + 50 + (w - 70) * (i / max(len(xs) - 1, 1))
    py = lambda v: y0 + 30 + (h - 70) * (1 - v / ymax)
    out = ['<text x="%.1f" y="%d" font-size="12" text-anchor="middle">%s</text>'
           % (x0 + w / 2, y0 + 16, escape(title)),
           '<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#444"/>'
           % (px(0), px(len(xs) - 1), py(0), py(0))]
    for k in range(5):
        v = ymax * k / 4
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="end">%.3g</text>'
                   % (x0 + 44, py(v) + 3, v))
        out.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>'
                   % (px(0), px(len(xs) - 1), py(v), py(v)))
    for i, x in enumerate(xs):
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s</text>'
                   % (px(i), py(0) + 14, x))
    out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">sessions (N)</text>'
               % (x0 + w / 2, py(0) + 28))
    out.append('<text x="%d" y="%.1f" font-size="10" transform="rotate(-90 %d %.1f)" '
               'text-anchor="middle">%s</text>' % (x0 + 10, y0 + h / 2, x0 + 10, y0 + h / 2,
                                                    escape(ylabel)))
    for j, (label, colour, dash, ys) in enumerate(series):
        pts = [(px(i), py(v)) for i, v in enumerate(ys) if v is not None]
        if pts:
            out.append('<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>' % (
                colour, ' stroke-dasharray="5,4"' if dash else "",
                " ".join("%.1f,%.1f" % p for p in pts)))
            out += ['<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x, y, colour)
                    for x, y in pts]
        out.append('<text x="%.1f" y="%.1f" font-size="10" fill="%s">%s</text>'
                   % (x0 + 60, y0 + 32 + 13 * j, colour, escape(label)))
    return out


def svg_bar_panel(x0, y0, w, h, title, bars, ylabel):
    """bars: [(label, colour, value)]."""
    ymax = max([v for _, _, v in bars if v is not None] + [1e-9]) * 1.15
    py = lambda v: y0 + 30 + (h - 80) * (1 - v / ymax)
    bw = (w - 70) / max(len(bars), 1)
    out = ['<text x="%.1f" y="%d" font-size="12" text-anchor="middle">%s</text>'
           % (x0 + w / 2, y0 + 16, escape(title)),
           '<text x="%d" y="%.1f" font-size="10" transform="rotate(-90 %d %.1f)" '
           'text-anchor="middle">%s</text>' % (x0 + 10, y0 + h / 2, x0 + 10, y0 + h / 2,
                                                escape(ylabel))]
    for i, (label, colour, v) in enumerate(bars):
        x = x0 + 50 + i * bw
        v = v or 0
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
                   % (x + 4, py(v), bw - 8, py(0) - py(v), colour))
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%.3g</text>'
                   % (x + bw / 2, py(v) - 3, v))
        for k, part in enumerate(label.split("\n")):
            out.append('<text x="%.1f" y="%.1f" font-size="9" text-anchor="middle">%s</text>'
                       % (x + bw / 2, py(0) + 12 + 11 * k, escape(part)))
    return out


def chart(res, path):
    sw = res["sweep"]
    xs = [r["n"] for r in sw]
    lc = {x["n"]: x for x in (res.get("llamacpp") or {}).get("results", [])}
    pw, ph = 460, 300
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif">' % (2 * pw, 2 * ph + 30),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" text-anchor="middle" font-size="14">%s</text>' % (
               pw, escape("riskkv-node serving SmolLM2-135M Q4_1 on %s CPUs (--threads 2), "
                          "%d tokens a stream" % (res["machine"]["cpus"],
                                                  res["config"]["tokens"])))]
    out += svg_line_panel(0, 30, pw, ph, "aggregate decode tokens/s", xs, [
        ("riskkv (gRPC, separate process)", "#4e79a7", False,
         [r["aggregate_tokens_per_second"] for r in sw]),
        ("llama.cpp (in-process llama_decode)", "#e15759", True,
         [lc.get(n, {}).get("aggregate_tokens_per_second") for n in xs])], "tokens/s")
    out += svg_line_panel(pw, 30, pw, ph, "inter-token gap, ms", xs, [
        ("riskkv p50 (median stream)", "#4e79a7", False,
         [1e3 * r["gap_median_seconds"] if r["gap_median_seconds"] else None for r in sw]),
        ("riskkv p99 (worst stream)", "#f28e2b", False,
         [1e3 * r["gap_p99_worst_seconds"] for r in sw]),
        ("llama.cpp step p50", "#e15759", True,
         [1e3 * lc[n]["step_median_seconds"] if n in lc else None for n in xs]),
        ("llama.cpp step p99", "#b07aa1", True,
         [1e3 * lc[n]["step_p99_seconds"] if n in lc else None for n in xs])], "ms")
    lp = res["long_prompt"]
    out += svg_bar_panel(0, 30 + ph, pw, ph, "%d-token prompt during %d decodes" % (
        lp["chunked"]["prompt_tokens"], lp["chunked"]["decoders"]), [
        ("chunked\nstep mean", "#76b7b2", 1e3 * (lp["chunked"]["step_mean_seconds"] or 0)),
        ("chunked\nworst gap", "#4e79a7", 1e3 * lp["chunked"]["worst_gap_seconds"]),
        ("unchunked\nstep mean", "#ff9da7", 1e3 * (lp["unchunked"]["step_mean_seconds"] or 0)),
        ("unchunked\nworst gap", "#e15759", 1e3 * lp["unchunked"]["worst_gap_seconds"])], "ms")
    bars = []
    for mode in res["config"]["modes"]:
        for state, colour in (("idle", "#59a14f"), ("busy", "#edc948")):
            bars.append(("%s\nB %s" % (mode, state), colour,
                         1e3 * (res["handover"]["%s/%s" % (mode, state)]["downtime_median_seconds"]
                                or 0)))
    out += svg_bar_panel(pw, 30 + ph, pw, ph, "live hand-over downtime (median)", bars, "ms")
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


# ---------------------------------------------------------------------------------------------


def chunk_sweep(args, cfg, chunks, tmp):
    """Phase 3 once per --prefill-chunk: prefill time of the long prompt and the decodes' worst
    gap, to choose the default chunk; writes DIR/chunk_sweep.json."""
    rows = {}
    for chunk in chunks:
        n = NodeProcess(args.bin, args.model, tmp, "chunk-%d" % chunk,
                        *(NODE_FLAGS + ["--prefill-chunk", str(chunk)]))
        try:
            client = n.client()
            ids = tokenize(client, 50 + cfg["long_prompt_tokens"] + 1 + 97 * 15 + 130)
            prompts = [ids[1 + 97 * i:1 + 97 * i + cfg["prompt_tokens"]] for i in range(16)]
            long_ids = ids[50:50 + cfg["long_prompt_tokens"]]
            warm_up(client, prompts[0])
            log("chunk %d: %d-token prompt during %d decodes" % (
                chunk, len(long_ids), cfg["decoders"]))
            rows[chunk] = long_prompt(n, prompts, long_ids, cfg["decoders"], chunk, cfg["reps"])
        finally:
            n.stop()
    with open(os.path.join(args.out, "chunk_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("| --prefill-chunk | prompt prefill s | step mean ms | worst decode gap ms | "
          "decode gap before ms |")
    print("|---|---|---|---|---|")
    for chunk, r in rows.items():
        print("| %d | %.2f | %.1f | %.1f | %.1f |" % (
            chunk, r["prefill_seconds"], 1e3 * (r["step_mean_seconds"] or 0),
            1e3 * r["worst_gap_seconds"], 1e3 * (r["gap_median_before_seconds"] or 0)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin", nargs="?")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--out", default="docs/serving-bench")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: N in 1, 2; 16 tokens; a 300-token prompt; 1 repetition")
    ap.add_argument("--reps", type=int,
                    help="rounds of the sweep, llama.cpp and the long prompt (default 3; quick 1)")
    ap.add_argument("--handover-reps", type=int,
                    help="hand-overs per mode and state of B (default 5; quick 1)")
    ap.add_argument("--chunk-sweep",
                    help="instead of the phases: the long prompt during decodes (phase 3) with "
                         "each --prefill-chunk in this comma-separated list, e.g. 32,64,128, to "
                         "choose the default")
    ap.add_argument("--llamacpp-worker", help=argparse.SUPPRESS)  # internal: a spec JSON
    args = ap.parse_args()
    if args.llamacpp_worker:
        spec = json.load(open(args.llamacpp_worker))
        print(json.dumps(llamacpp_worker(spec["model"], spec["prompts"], spec["ns"],
                                         spec["tokens"], 2, spec["reps"])))
        return 0
    if not args.bin or not args.model:
        ap.error("BIN_DIR and MODEL are required")
    q = args.quick
    cfg = {"ns": [1, 2] if q else [1, 2, 4, 8, 16], "llamacpp_ns": [1, 2] if q else [1, 4, 8, 16],
           "tokens": 16 if q else 96, "prompt_tokens": 130,
           "long_prompt_tokens": 300 if q else 2000,
           "decoders": 2 if q else 8, "history_tokens": 500, "reps": args.reps or (1 if q else 3),
           "handover_reps": args.handover_reps or (1 if q else 5),
           "modes": HANDOVER_MODES, "node_flags": NODE_FLAGS,
           "unchunked_flags": UNCHUNKED, "quick": q}
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="riskkv-serving-")
    if args.chunk_sweep:
        return chunk_sweep(args, cfg, [int(c) for c in args.chunk_sweep.split(",")], tmp)
    res = {"config": cfg, "machine": {
        "cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_start": os.getloadavg(),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                     if l.startswith("model name")), "?")}, "node_logs": tmp}
    log("node logs in %s" % tmp)
    load = MachineLoad()
    nodes = []

    def node(name, *flags):
        n = NodeProcess(args.bin, args.model, tmp, name, *(NODE_FLAGS + list(flags)))
        nodes.append(n)
        return n

    def stop_all():
        while nodes:
            nodes.pop().stop()

    try:
        # The sweep's node also tokenizes the text for every phase.
        a = node("sweep")
        stride = 97
        need = max(1 + stride * 15 + cfg["prompt_tokens"], 50 + cfg["long_prompt_tokens"],
                   200 + cfg["history_tokens"] + 40) + 10
        log("tokenizing %s with the node (%d tokens)" % (TEXT, need))
        ids = tokenize(a.client(), need)
        if len(ids) < need:
            raise RuntimeError("the text has only %d tokens, %d wanted" % (len(ids), need))
        prompts = [ids[1 + stride * i:1 + stride * i + cfg["prompt_tokens"]] for i in range(16)]
        long_ids = ids[50:50 + cfg["long_prompt_tokens"]]
        history = ids[200:200 + cfg["history_tokens"] + 33]
        warm_up(a.client(), prompts[0])
        log("phase 1: concurrency sweep N in %s, %d tokens a stream" % (cfg["ns"], cfg["tokens"]))
        res["sweep"] = sweep(a, prompts, cfg["ns"], cfg["tokens"], cfg["reps"])
        stop_all()
        load.phase("phase 1 (sweep)")

        log("phase 2: llama.cpp batched decode, N in %s (no node running)" % cfg["llamacpp_ns"])
        lc = llamacpp(args.model, prompts, cfg["llamacpp_ns"], cfg["tokens"], cfg["reps"], tmp)
        if lc is None:
            res["llamacpp_skipped"] = "llama-cpp-python is not installed in %s" % sys.executable
        else:
            res["llamacpp"] = lc
        load.phase("phase 2 (llama.cpp)")

        res["long_prompt"] = {}
        for name, flags in (("chunked", []), ("unchunked", UNCHUNKED)):
            log("phase 3: %d-token prompt during %d decodes, %s" % (
                cfg["long_prompt_tokens"], cfg["decoders"], name))
            n = node("prompt-" + name, *flags)
            warm_up(n.client(), prompts[0])
            res["long_prompt"][name] = long_prompt(n, prompts, long_ids, cfg["decoders"], 64,
                                                   cfg["reps"])
            res["long_prompt"][name]["flags"] = flags
            stop_all()
            load.phase("phase 3 (long prompt, %s)" % name)
        log("phase 4: live hand-over A -> B, modes %s, %d each" % (cfg["modes"],
                                                                cfg["handover_reps"]))
        na, nb = node("A", *POLICY_FLAGS), node("B", *POLICY_FLAGS)
        warm_up(na.client(), prompts[0])
        warm_up(nb.client(), prompts[0])
        res["handover"] = handover(na, nb, prompts, history, cfg["modes"], cfg["handover_reps"],
                                   cfg["decoders"], "hand-over")
        stop_all()
        load.phase("phase 4 (hand-over)")
    except Exception:
        for n in nodes:
            log("%s log tail:\n%s" % (n.name, n.log_tail()))
        stop_all()
        raise
    res["wall_seconds"] = time.time() - T0
    res["machine_load"] = load.phases
    table, goals = goals_and_table(res)
    res["goals"] = [{"goal": g, "pass": ok, "detail": d} for g, ok, d in goals]
    with open(os.path.join(args.out, "serving_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    chart(res, os.path.join(args.out, "serving_bench.svg"))
    print(table)
    print("\n(wall %.0f s; %s)" % (res["wall_seconds"],
                                   os.path.join(args.out, "serving_bench.json")))
    return 0 if all(ok for _, ok, _ in goals) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:
        log("error: %r" % e)
        raise SystemExit(2)

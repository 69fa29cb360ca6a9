#!/usr/bin/env python3
"""A node's memory through a storm of cut-off receives and short-lived sessions, with real
processes: does it give back what the storm took?

A target node serving SmolLM2 (one thread) holds one live session. A source node behind a
50 kbit/s link then starts STORM migrations of a 10-token session to it, and cuts each off (its
riskkvctl killed) once the target has taken the handshake and charged its rows: the pattern of
issue 18's attack, where each handshake made the target allocate a full-capacity cache. Then
SESSIONS sessions of 512 tokens are started on the target and closed again, fifteen at a time.
The target's VmRSS is sampled every 50 ms throughout; at the end it is set against the model's
RSS (the node before any session) plus the live session's KV (`riskkv_kv_bytes{state="sessions"}`).

    memory_storm.py BIN_DIR MODEL [--out DIR] [--storm N] [--sessions N]

Writes DIR/memory_storm.json (every sample, the phases, the figures) and DIR/memory_storm.svg
(RSS over time), and prints the figures.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from xml.sax.saxutils import escape


def rss_kb(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError("no %s for pid %d" % (field, pid))


class Node:
    def __init__(self, bin_dir, model, tmp, name, *flags):
        self.bin, self.ports = bin_dir, os.path.join(tmp, name + ".ports")
        self.log = open(os.path.join(tmp, name + ".log"), "wb")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "riskkv-node"), "--model", model, "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--port-file", self.ports, "--threads", "1"]
            + list(flags), stdout=self.log, stderr=self.log)
        for _ in range(600):
            if os.path.exists(self.ports) and os.path.getsize(self.ports) > 0:
                grpc_port, metrics_port = open(self.ports).read().split()[:2]
                self.addr = "127.0.0.1:" + grpc_port
                self.metrics_url = "http://127.0.0.1:%s/metrics" % metrics_port
                return
            if self.proc.poll() is not None:
                sys.exit("%s exited on start" % name)
            time.sleep(0.1)
        sys.exit("%s did not start" % name)

    def ctl(self, *argv):
        r = subprocess.run([os.path.join(self.bin, "riskkvctl"), "--node", self.addr] + list(argv),
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit("riskkvctl %s: %s" % (" ".join(argv), r.stderr.strip()))
        return json.loads(r.stdout)

    def metric(self, name, labels=""):
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            m = re.match(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), line)
            if m and labels in (m.group(1) or ""):
                total += float(m.group(2))
        return total


def chart(samples, phases, figures, path):
    """RSS over time, one band per phase, the reference (model + live KV) and its 1.2x bound."""
    w, h, left, top, bottom = 760, 320, 64, 40, 50
    t_end = samples[-1][0] or 1.0
    y_max = max(max(s[1] for s in samples), figures["bound_mb"]) * 1.1
    x = lambda t: left + (w - left - 20) * t / t_end
    y = lambda mb: top + (h - top - bottom) * (1 - mb / y_max)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
           % (w, h), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" text-anchor="middle" font-size="14">%s</text>'
           % (w / 2, escape("riskkv-node VmRSS through a storm of cut-off receives and "
                            "closed sessions (SmolLM2, one thread)"))]
    shades = ["#f2f2f2", "#e3ecf7"]
    for i, (name, t0, t1) in enumerate(phases):
        out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>'
                   % (x(t0), top, max(x(t1) - x(t0), 1), h - top - bottom, shades[i % 2]))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%s</text>'
                   % ((x(t0) + x(t1)) / 2, top + 12 + 12 * (i % 3), escape(name)))
    for mb, label, dash in ((figures["reference_mb"], "model + live KV", ""),
                            (figures["bound_mb"], "1.2 x that", ' stroke-dasharray="5,4"')):
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#59a14f"%s/>'
                   % (left, w - 20, y(mb), y(mb), dash))
        out.append('<text x="%d" y="%.1f" font-size="10" fill="#59a14f" text-anchor="end">%s'
                   '</text>' % (w - 22, y(mb) - 3, escape(label)))
    pts = " ".join("%.1f,%.1f" % (x(t), y(mb)) for t, mb in samples)
    out.append('<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="%s"/>' % pts)
    for i in range(6):
        mb = y_max * i / 5
        out.append('<text x="%d" y="%.1f" font-size="10" text-anchor="end">%.0f</text>'
                   % (left - 6, y(mb) + 3, mb))
    out.append('<text x="14" y="%d" font-size="11" transform="rotate(-90 14 %d)" '
               'text-anchor="middle">VmRSS, MB</text>' % (h / 2, h / 2))
    for i in range(6):
        t = t_end * i / 5
        out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%.0f</text>'
                   % (x(t), h - bottom + 16, t))
    out.append('<text x="%d" y="%d" font-size="11" text-anchor="middle">seconds</text>'
               % ((left + w) / 2, h - 12))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--out", default="docs/memory-storm")
    ap.add_argument("--storm", type=int, default=100)
    ap.add_argument("--sessions", type=int, default=32)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="riskkv-storm-")
    target = Node(args.bin, args.model, tmp, "target")
    source = None
    samples, phases, stop = [], [], threading.Event()
    t0 = time.time()

    def sample():
        while not stop.is_set():
            samples.append((time.time() - t0, rss_kb(target.proc.pid) / 1000.0))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    phase_start = [0.0]

    def phase(name):
        now = time.time() - t0
        phases.append((name, phase_start[0], now))
        phase_start[0] = now
        print("[%5.1f s] %s: VmRSS %.1f MB" % (now, name, rss_kb(target.proc.pid) / 1000.0),
              flush=True)

    try:
        time.sleep(3)
        model_mb = rss_kb(target.proc.pid) / 1000.0
        phase("model, no session")
        prompt = json.dumps([(i * 37) % 40000 + 100 for i in range(512)])
        target.ctl("start", "--tokens", prompt)
        time.sleep(1)
        live_kv_mb = target.metric("riskkv_kv_bytes", 'state="sessions"') / 1e6
        live_mb = rss_kb(target.proc.pid) / 1000.0
        phase("one live session")

        source = Node(args.bin, args.model, tmp, "source", "--link-mbps", "0.05")
        small = source.ctl("start", "--tokens", json.dumps(list(range(200, 210))))["sessionId"]
        failures0 = target.metric("riskkv_migration_failures_total", 'role="target"')
        peak_receiving = 0.0
        for i in range(args.storm):
            mig = subprocess.Popen([os.path.join(args.bin, "riskkvctl"), "--node", source.addr,
                                    "migrate", "--session", small, "--to", target.addr, "--mode",
                                    "full_kv", "--nolive", "--nofallback"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(400):
                receiving = target.metric("riskkv_kv_bytes", 'state="receiving"')
                if receiving > 0:
                    peak_receiving = max(peak_receiving, receiving)
                    break
                time.sleep(0.01)
            else:
                sys.exit("receive %d never charged its rows on the target" % (i + 1))
            mig.send_signal(signal.SIGKILL)
            mig.wait()
            for _ in range(1000):
                if target.metric("riskkv_kv_bytes", 'state="receiving"') == 0:
                    break
                time.sleep(0.01)
            else:
                sys.exit("receive %d still holds its rows after its caller left" % (i + 1))
            if (i + 1) % 20 == 0:
                print("  %d/%d receives cut off, VmRSS %.1f MB" % (
                    i + 1, args.storm, rss_kb(target.proc.pid) / 1000.0), flush=True)
        cut = target.metric("riskkv_migration_failures_total", 'role="target"') - failures0
        phase("%d receives cut off" % args.storm)

        done = 0
        while done < args.sessions:
            batch = min(15, args.sessions - done)
            ids = [target.ctl("start", "--tokens", json.dumps(
                [(i * 53 + k) % 40000 + 100 for i in range(512)]))["sessionId"]
                for k in range(done, done + batch)]
            for sid in ids:
                target.ctl("close", "--session", sid)
            done += batch
            print("  %d/%d sessions started and closed, VmRSS %.1f MB" % (
                done, args.sessions, rss_kb(target.proc.pid) / 1000.0), flush=True)
        phase("%d sessions started, closed" % args.sessions)
        time.sleep(2)
        after_mb = rss_kb(target.proc.pid) / 1000.0
        peak_mb = rss_kb(target.proc.pid, "VmHWM") / 1000.0
        after_kv_mb = target.metric("riskkv_kv_bytes", 'state="sessions"') / 1e6
        phase("after")
    finally:
        stop.set()
        for n in (target, source):
            if n is not None and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGTERM)
                n.proc.wait(timeout=30)
    reference = model_mb + live_kv_mb
    figures = {
        "model_mb": model_mb, "live_session_kv_mb": live_kv_mb, "one_session_rss_mb": live_mb,
        "receives_cut_off": args.storm, "target_failures_counted": cut,
        "peak_receiving_kv_bytes": peak_receiving, "sessions_started_and_closed": args.sessions,
        "after_rss_mb": after_mb, "after_sessions_kv_mb": after_kv_mb, "peak_rss_mb": peak_mb,
        "reference_mb": reference, "bound_mb": 1.2 * reference, "after_over_reference":
        after_mb / reference,
    }
    with open(os.path.join(args.out, "memory_storm.json"), "w") as f:
        json.dump({"figures": figures, "phases": phases, "samples": samples}, f, indent=1)
    chart(samples, phases, figures, os.path.join(args.out, "memory_storm.svg"))
    print("model %.1f MB; one live session's KV %.1f MB (RSS %.1f MB)" % (
        model_mb, live_kv_mb, live_mb))
    print("%d receives cut off (%d failures counted, each charged %.0f KB), %d sessions started "
          "and closed" % (args.storm, cut, peak_receiving / 1e3, args.sessions))
    print("after: VmRSS %.1f MB = %.3f x (model + live KV = %.1f MB; goal <= 1.2), peak %.1f MB" % (
        after_mb, after_mb / reference, reference, peak_mb))
    return 0 if after_mb <= 1.2 * reference else 1


if __name__ == "__main__":
    sys.exit(main())

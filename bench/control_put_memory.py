#!/usr/bin/env python3
"""The control plane's memory for one put of the largest bank it takes, with real processes.

Writes a predictor bank of about 250 MiB in the format of common/recovery/predictor_bank.h (one
group rebuilding SmolLM2's layer 28 from layer 27, a map over 340,000 features; zero weights, a
sound checksum), a policy naming it (the shipped SmolLM2 policy with that group, encoded by
protoc), starts riskkv-control on an empty store, puts both with riskkvctl (PutPolicyStream,
1 MiB pieces) and samples the control plane's anonymous and file-backed resident memory every
20 ms. Anonymous memory is what the process holds; file-backed pages are the bank's own file,
which the control plane maps to check it whole and which the kernel may drop at any time.

    control_put_memory.py BIN_DIR PROTO_DIR POLICY_TXT [--out FILE.json]
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

KV_WIDTH, FEATURES, TARGET, ANCHOR = 192, 340000, 28, 27


def align(x, a):
    return (x + a - 1) // a * a


def write_bank(path, fingerprint):
    """A version-1 bank: fixed header, fingerprint, one group of one layer, four payload blocks."""
    header = align(align(68 + len(fingerprint), 8) + 16, 8) + 96
    blocks, pos = [], header
    for length in (KV_WIDTH * FEATURES * 2, KV_WIDTH * FEATURES * 2, KV_WIDTH * 4, KV_WIDTH * 4):
        pos = align(pos, 64)
        blocks.append((pos, length))
        pos += length
    size = pos
    head = bytearray(header)
    head[0:8] = b"RKVBANK\0"
    struct.pack_into("<II", head, 8, 1, header)
    struct.pack_into("<QIII", head, 48, size, 1, 1, len(fingerprint))  # f16 maps, one group
    head[68:68 + len(fingerprint)] = fingerprint.encode()
    p = align(68 + len(fingerprint), 8)
    struct.pack_into("<IIii", head, p, 1, 1, TARGET, ANCHOR)
    p = align(p + 16, 8)
    struct.pack_into("<iIqqd", head, p, TARGET, 0, FEATURES, KV_WIDTH, 1.0)
    p += 32
    for offset, length in blocks:
        struct.pack_into("<QQ", head, p, offset, length)
        p += 16
    checksum = hashlib.sha256(bytes(head))  # the checksum field still zero
    zeros, left = bytes(1 << 20), size - header
    while left:
        n = min(left, len(zeros))
        checksum.update(zeros[:n])
        left -= n
    struct.pack_into("32s", head, 16, checksum.digest())
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest(), size


def status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("proto_dir")
    ap.add_argument("policy_txt")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="riskkv-put-")
    text = open(args.policy_txt).read().splitlines()
    fingerprint = next(l.split('"')[1] for l in text if l.startswith("model_fingerprint:"))
    sha, size = write_bank(os.path.join(tmp, "bank.rkvbank"), fingerprint)
    kept = "kept_layers: %d" % TARGET
    lines = [l for l in text if l.strip() != kept and not l.startswith("predictor_bank_sha256")]
    lines = ['policy_id: "smollm2-largest-bank"' if l.startswith("policy_id:") else l
             for l in lines]
    lines += ["rebuilt_groups { targets: %d anchors: %d }" % (TARGET, ANCHOR),
              'predictor_bank_sha256: "%s"' % sha]
    with open(os.path.join(tmp, "policy.pb"), "wb") as f:
        subprocess.run(["protoc", "-I", args.proto_dir, "--encode=riskkv.v1.RetentionPolicy",
                        "riskkv/v1/retention_policy.proto"], input="\n".join(lines).encode(),
                       stdout=f, check=True)
    ports = os.path.join(tmp, "control.ports")
    log = open(os.path.join(tmp, "control.log"), "wb")
    control = subprocess.Popen([os.path.join(args.bin, "riskkv-control"), "--store",
                                os.path.join(tmp, "store"), "--listen", "127.0.0.1:0",
                                "--metrics-listen", "127.0.0.1:0", "--port-file", ports],
                               stdout=log, stderr=log)
    try:
        for _ in range(300):
            if os.path.exists(ports) and os.path.getsize(ports) > 0:
                break
            time.sleep(0.05)
        else:
            sys.exit("riskkv-control did not start")
        addr = "127.0.0.1:" + open(ports).read().split()[0]
        time.sleep(0.5)
        before = status(control.pid)
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(status(control.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.time()
        put = subprocess.run([os.path.join(args.bin, "riskkvctl"), "--control", addr,
                              "policy-put", "--policy", os.path.join(tmp, "policy.pb"), "--bank",
                              os.path.join(tmp, "bank.rkvbank")], capture_output=True, text=True)
        seconds = time.time() - t0
        time.sleep(0.2)
        stop.set()
        sampler.join()
        after = status(control.pid)
        if put.returncode != 0:
            sys.exit("the put was refused: " + put.stderr.strip())
    finally:
        control.terminate()
        control.wait(timeout=30)
        subprocess.run(["rm", "-rf", tmp])
    figures = {
        "bank_bytes": size, "put_seconds": seconds,
        "before_rss_bytes": before["VmRSS"], "after_rss_bytes": after["VmRSS"],
        "peak_rss_bytes": after["VmHWM"],
        "peak_anon_bytes": max(s["RssAnon"] for s in samples),
        "peak_file_bytes": max(s["RssFile"] for s in samples),
    }
    mb = lambda b: b / 1e6
    print("one put of a %.1f MB bank in %.2f s: control plane VmRSS %.1f MB before, %.1f MB after; "
          "peak %.1f MB (VmHWM), of which anonymous at most %.1f MB (%.3f of the bank) and the "
          "bank's own mapped file at most %.1f MB" % (
              mb(size), seconds, mb(before["VmRSS"]), mb(after["VmRSS"]), mb(after["VmHWM"]),
              mb(figures["peak_anon_bytes"]), figures["peak_anon_bytes"] / size,
              mb(figures["peak_file_bytes"])))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

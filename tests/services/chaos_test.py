"""Chaos between real processes: a control plane and two riskkv-node processes serving SmolLM2,
each behind a TCP proxy, and N live migrations of generating sessions (riskkvctl generate and
riskkvctl migrate --live, as a user runs them), each with a fault drawn from a seeded generator:

  none          the migration runs undisturbed
  kill_source   SIGKILL of the source at a random point, restarted at once (as a supervisor
                such as compose's restart policy would)
  kill_target   SIGKILL of the target at a random point, restarted at once
  kill_control  SIGKILL of the control plane at a random point, restarted at once
  drop_commit   the target's proxy drops every reply after the source's commit (the target took
                the session, the source never hears it) for a random while, then cuts the link
  partition     the target's proxy drops everything both ways and refuses new connections for a
                random while from a random point, then cuts the links it held

After each migration every session on every node is counted by the prefix of its token ids (each
session starts with its own): no session may exist twice (duplicated), and every session must be
where the outcome says it is (lost: gone although no process that held it died). A session on a
killed node dies with it and is replaced. A stream that no fault touched must deliver exactly
the tokens it asked for, the same the session then holds (a partition may cut a stream's leg to
the target, never its leg on the source). Exit 1 on the first violation.

  chaos_test.py BIN_DIR MODEL POLICY [--migrations N] [--seed S]
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

FAULTS = ["none", "kill_source", "kill_target", "kill_control", "drop_commit", "partition"]
MODES = ["full_kv", "reconstruct", "token_replay"]
POOL = 4  # sessions alive at a time
MIGRATIONS_PER_SESSION = 4  # then the session is closed and a new one started
PREFIX = 3  # token ids that name a session
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Failure(Exception):
    pass


class Link:
    """One proxied TCP connection; `c2s` and `s2c` pump bytes until either side closes."""

    def __init__(self, proxy, client, server):
        self.proxy, self.client, self.server = proxy, client, server
        self.drop_s2c = False  # replies are dropped
        self.drop_c2s = False  # requests are dropped
        self.closed = False
        self.frames = {}  # HTTP/2 stream id -> DATA frames seen from the client
        self.buf, self.preface = b"", True  # the client's bytes not yet parsed into frames
        threading.Thread(target=self.pump_c2s, daemon=True).start()
        threading.Thread(target=self.pump_s2c, daemon=True).start()

    def close(self):
        if self.closed:
            return
        self.closed = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def pump(self, src, dst, dropped, watch=None):
        """Copies src to dst until either closes, dropping what `dropped()` says; `watch` sees
        every byte the client sent."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not dropped():
                    dst.sendall(data)
                if watch:
                    watch(data)
        except OSError:
            pass
        self.close()

    def pump_c2s(self):
        self.pump(self.client, self.server, lambda: self.drop_c2s, self.watch_frames)

    def pump_s2c(self):
        self.pump(self.server, self.client, lambda: self.drop_s2c)

    def watch_frames(self, data):
        """The client's HTTP/2 frames: a stream that sent several DATA frames and then ends
        (END_STREAM) is a Receive whose commit went out."""
        self.buf += data
        if self.preface:
            if len(self.buf) < len(H2_PREFACE):
                return
            self.buf, self.preface = self.buf[len(H2_PREFACE):], False
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                return
            ftype, flags = self.buf[3], self.buf[4]
            sid = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
            self.buf = self.buf[9 + length:]
            if ftype == 0:
                self.frames[sid] = self.frames.get(sid, 0) + 1
                if flags & 1 and self.frames[sid] >= 3:
                    self.proxy.commit_sent(self)


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of one server whose port changes when it restarts."""

    def __init__(self, name):
        self.name = name
        self.backend = None
        self.lock = threading.Lock()
        self.links = []
        self.refusing = False
        self.commit_hold = None  # armed: seconds to drop replies once a commit went out
        self.commit_drops = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.sock.accept()
            with self.lock:
                backend, refusing = self.backend, self.refusing
            if refusing or backend is None:
                client.close()
                continue
            try:
                server = socket.create_connection(backend, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.links = [l for l in self.links if not l.closed]
                self.links.append(Link(self, client, server))

    def arm_commit_drop(self, hold):
        with self.lock:
            self.commit_hold = hold

    def disarm(self):
        with self.lock:
            self.commit_hold = None

    def commit_sent(self, link):
        with self.lock:
            hold, self.commit_hold = self.commit_hold, None
            if hold is None:
                return
            self.commit_drops += 1
        link.drop_s2c = True
        threading.Timer(hold, link.close).start()

    def partition(self, hold):
        with self.lock:
            self.refusing = True
            cut = [l for l in self.links if not l.closed]
        for l in cut:
            l.drop_c2s = l.drop_s2c = True

        def heal():
            for l in cut:
                l.close()
            with self.lock:
                self.refusing = False

        threading.Timer(hold, heal).start()

    def wait_healed(self):
        while True:
            with self.lock:
                if not self.refusing:
                    return
            time.sleep(0.05)


class Cluster:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.procs = {}
        self.direct = {}
        self.proxies = {n: Proxy(n) for n in ("control", "a", "b")}
        self.logs = []

    def _start(self, name, argv):
        ports = os.path.join(self.tmp, name + ".ports")
        if os.path.exists(ports):
            os.remove(ports)
        log = open(os.path.join(self.tmp, name + ".log"), "ab")
        self.procs[name] = subprocess.Popen(argv + ["--listen", "127.0.0.1:0", "--metrics-listen",
                                                    "127.0.0.1:0", "--port-file", ports],
                                            stdout=log, stderr=log)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.procs[name].poll() is not None:
                raise Failure("%s exited with %d on start" % (name, self.procs[name].returncode))
            if os.path.exists(ports) and os.path.getsize(ports) > 0:
                port = int(open(ports).read().split()[0])
                self.direct[name] = "127.0.0.1:%d" % port
                with self.proxies[name].lock:
                    self.proxies[name].backend = ("127.0.0.1", port)
                return
            time.sleep(0.05)
        raise Failure("%s did not start within 60 s" % name)

    def start_control(self):
        self._start("control", [os.path.join(self.args.bin, "riskkv-control"), "--store",
                                os.path.join(self.tmp, "store")])

    def start_node(self, name):
        self._start(name, [os.path.join(self.args.bin, "riskkv-node"), "--model", self.args.model,
                           "--threads", "1", "--link-mbps", "50",
                           "--control", self.proxies["control"].address,
                           "--policy-id", self.args.policy_id,
                           "--cache-dir", os.path.join(self.tmp, "cache-" + name),
                           "--timeout", "60"])

    def kill(self, name):
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()
        with self.proxies[name].lock:
            self.proxies[name].backend = None

    def restart(self, name):
        self.start_control() if name == "control" else self.start_node(name)

    def alive(self, name):
        return self.procs[name].poll() is None

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def tails(self):
        out = []
        for f in sorted(os.listdir(self.tmp)):
            if f.endswith(".log"):
                lines = open(os.path.join(self.tmp, f), errors="replace").read().splitlines()
                out.append("--- %s\n%s" % (f, "\n".join(lines[-10:])))
        return "\n".join(out)


def ctl(cluster, node, *argv, timeout=60):
    r = subprocess.run([os.path.join(cluster.args.bin, "riskkvctl"), "--node", cluster.direct[node]]
                       + list(argv), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise Failure("riskkvctl %s on %s: %s" % (" ".join(argv), node, r.stderr.strip()))
    return json.loads(r.stdout)


def census(cluster):
    """Every session on every live node: token-id prefix -> [(node, id, token ids)]."""
    seen = {}
    for node in ("a", "b"):
        if not cluster.alive(node):
            continue
        for s in ctl(cluster, node, "list").get("sessions", []):
            info = ctl(cluster, node, "show", "--session", s["sessionId"])
            ids = [int(t) for t in info.get("tokenIds", [])]
            seen.setdefault(tuple(ids[:PREFIX]), []).append((node, s["sessionId"], ids))
    return seen


def wait_busy(cluster, node, sid, gen):
    """Until the generate stream holds the session (or has already ended)."""
    deadline = time.time() + 20
    while time.time() < deadline and gen.poll() is None:
        for s in ctl(cluster, node, "list").get("sessions", []):
            if s["sessionId"] == sid and s.get("busy"):
                return
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("policy", help="a policy.pb the control plane stores and the nodes follow "
                    "(with the bank.rkvbank beside it, if any)")
    ap.add_argument("--policy-id", default="smollm2-135m-instruct")
    ap.add_argument("--migrations", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="riskkv-chaos-")
    cluster = Cluster(args, tmp)
    t0 = time.time()
    try:
        cluster.start_control()
        # The bank beside the policy, when it rebuilds layers (none when it keeps every layer).
        bank = os.path.join(os.path.dirname(args.policy), "bank.rkvbank")
        put = [os.path.join(args.bin, "riskkvctl"), "--control", cluster.direct["control"],
               "policy-put", "--policy", args.policy]
        if os.path.exists(bank):
            put += ["--bank", bank]
        r = subprocess.run(put, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise Failure("policy-put: " + r.stderr)
        cluster.start_node("a")
        cluster.start_node("b")
        counts = run(cluster, rng, args)
        print("chaos: %d migrations in %.0f s, seed %d" % (args.migrations, time.time() - t0,
                                                            args.seed))
        for k in FAULTS:
            print("  %-12s %s" % (k, counts["faults"].get(k, {})))
        print("  sessions: %(started)d started, %(closed)d closed, %(died)d died with their "
              "node, %(alive)d alive; lost 0, duplicated 0" % counts["sessions"])
        print("  commit replies dropped at the target's proxy: %d" % counts["commit_drops"])
        # The run must have exercised what it claims to.
        for fault, what in (("drop_commit", "ok"), ("kill_source", "failed"),
                            ("kill_target", "failed"), ("partition", None)):
            got = counts["faults"].get(fault, {})
            if sum(got.values()) == 0 or (what and got.get(what, 0) == 0):
                raise Failure("no %s migration ended %s: %s" % (fault, what or "at all", got))
        if counts["commit_drops"] == 0:
            raise Failure("no commit reply was ever dropped")
        print("chaos_test: ok")
        return 0
    except (Failure, subprocess.TimeoutExpired) as e:
        print("FAIL: %s" % e, file=sys.stderr)
        print(cluster.tails(), file=sys.stderr)
        return 1
    finally:
        cluster.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def run(cluster, rng, args):
    sessions = {}  # prefix -> {"node", "id", "moves"}
    counts = {"faults": {}, "sessions": {"started": 0, "closed": 0, "died": 0, "alive": 0},
              "commit_drops": 0}
    serial = 0
    history = list(range(1000, 1400))  # filler token ids after the naming prefix
    for i in range(args.migrations):
        while len(sessions) < POOL:
            serial += 1
            node = rng.choice(["a", "b"])
            prefix = (17, 20000 + serial, 30000 + serial)
            tokens = list(prefix) + history[:rng.randint(48, 160)]
            info = ctl(cluster, node, "start", "--tokens", json.dumps(tokens))
            sessions[prefix] = {"node": node, "id": info["sessionId"], "moves": 0}
            counts["sessions"]["started"] += 1
        prefix = rng.choice(sorted(sessions))
        s = sessions[prefix]
        src = s["node"]
        dst = "b" if src == "a" else "a"
        mode, fault = rng.choice(MODES), rng.choice(FAULTS)
        at, hold, n = rng.uniform(0.0, 1.2), rng.uniform(0.3, 3.0), rng.randint(24, 64)
        bin_ctl = os.path.join(args.bin, "riskkvctl")
        gen = subprocess.Popen([bin_ctl, "--node", cluster.direct[src], "generate", "--session",
                                s["id"], "-n", str(n), "--ids"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        wait_busy(cluster, src, s["id"], gen)
        if fault == "drop_commit":
            cluster.proxies[dst].arm_commit_drop(hold)
        drops_before = cluster.proxies[dst].commit_drops
        mig = subprocess.Popen([bin_ctl, "--node", cluster.direct[src], "migrate", "--session",
                                s["id"], "--to", cluster.proxies[dst].address, "--mode", mode,
                                "--live"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        killed = set()
        if fault in ("kill_source", "kill_target", "kill_control", "partition"):
            time.sleep(at)
            if fault == "partition":
                cluster.proxies[dst].partition(hold)
            else:
                victim = {"kill_source": src, "kill_target": dst, "kill_control": "control"}[fault]
                cluster.kill(victim)
                killed.add(victim)
                # Restarted at once, as a supervisor would: a source that sent its commit and
                # lost the target asks the new process, which knows nothing of the migration.
                cluster.restart(victim)
        try:
            mig_out, mig_err = mig.communicate(timeout=120)
            gen_out, gen_err = gen.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in (mig, gen):
                p.kill()
            raise Failure("%s -> %s %s %s at %.2f s: riskkvctl still running after 120 s" % (
                src, dst, mode, fault, at))
        cluster.proxies[dst].disarm()
        if cluster.proxies[dst].commit_drops > drops_before:
            counts["commit_drops"] += 1
        migrated = mig.returncode == 0
        outcome = "ok" if migrated else "failed"
        tally = counts["faults"].setdefault(fault, {})
        tally[outcome] = tally.get(outcome, 0) + 1
        cluster.proxies[dst].wait_healed()
        seen = census(cluster)
        where = "%s -> %s %s %s at %.2f s" % (src, dst, mode, fault, at)
        line = "[%d/%d] %s: migrate %s" % (i + 1, args.migrations, where, outcome)

        # The migrated session.
        copies = seen.get(prefix, [])
        if len(copies) > 1:
            raise Failure("%s: session %s duplicated: %s" % (where, prefix, [c[:2] for c in copies]))
        if fault == "kill_source":
            expect = [dst] if migrated else ([dst] if copies else [])
        elif fault == "kill_target":
            expect = [] if migrated else [src]
        else:
            expect = [dst] if migrated else [src]
        got = [c[0] for c in copies]
        if got != expect:
            raise Failure("%s: session %s is on %s, expected on %s (migrate: %s%s)" % (
                where, prefix, got or "no node", expect or "no node", outcome,
                (mig_out + mig_err).strip()[-300:]))
        if copies:
            s["node"], s["id"] = copies[0][0], copies[0][1]
            if migrated:
                s["moves"] += 1
            line += ", on %s" % s["node"]
        else:
            del sessions[prefix]
            counts["sessions"]["died"] += 1
            line += ", died with its node"
        # A stream no kill touched delivered exactly its tokens, the ones the session holds. A
        # partition may cut the stream's second leg, to the target through its proxy, but never
        # the first.
        if fault == "partition" and gen.returncode != 0 and "moved to" in gen_err:
            line += ", the stream's leg to the target cut by the partition"
        elif fault in ("none", "kill_control", "drop_commit", "partition"):
            if gen.returncode != 0:
                raise Failure("%s: generate failed: %s" % (where, gen_err.strip()))
            ids = json.loads(gen_out)
            if len(ids) != n or copies[0][2][-n:] != ids:
                raise Failure("%s: the stream got %d tokens %s, asked %d; the session ends %s" % (
                    where, len(ids), ids, n, copies[0][2][-n:]))
        # Every other session: where it was, unless its node died.
        for p in sorted(sessions):
            if p == prefix:
                continue
            t = sessions[p]
            got = [c[0] for c in seen.get(p, [])]
            if t["node"] in killed:
                if got:
                    raise Failure("%s: session %s came back on %s after its node died" % (
                        where, p, got))
                del sessions[p]
                counts["sessions"]["died"] += 1
            elif got != [t["node"]] or seen[p][0][1] != t["id"]:
                raise Failure("%s: session %s, untouched on %s, is now on %s" % (
                    where, p, t["node"], got or "no node"))
        unknown = [p for p in seen if p not in sessions]
        if unknown:
            raise Failure("%s: sessions nobody started: %s" % (where, unknown))
        if prefix in sessions and sessions[prefix]["moves"] >= MIGRATIONS_PER_SESSION:
            ctl(cluster, sessions[prefix]["node"], "close", "--session", sessions[prefix]["id"])
            del sessions[prefix]
            counts["sessions"]["closed"] += 1
        print(line, flush=True)
    counts["sessions"]["alive"] = len(sessions)
    return counts


if __name__ == "__main__":
    sys.exit(main())

"""Real riskkv-node processes for benchmark scripts, and a client for them that the project did not
generate: PyPI grpcio with server reflection (as tests/tools/reflection_client.py), no stubs.

    node = NodeProcess(bin_dir, model, tmp, "a", "--threads", "2")
    client = node.client()
    sid = client.start(token_ids=[...])["sessionId"]
    for reply in client.generate(sid, 16): ...
    node.metrics()["riskkv_batch_items_count"]  # Prometheus text, summed over labels
    node.stop()
"""
import os
import re
import signal
import subprocess
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

NODE_SERVICE = "riskkv.v1.Node"


class NodeProcess:
    """One riskkv-node on loopback ports it picks itself, its log in TMP/NAME.log."""

    def __init__(self, bin_dir, model, tmp, name, *flags, start_timeout=60.0):
        self.name = name
        self.ports = os.path.join(tmp, name + ".ports")
        self.log_path = os.path.join(tmp, name + ".log")
        if os.path.exists(self.ports):
            os.remove(self.ports)
        self._log = open(self.log_path, "wb")
        self.argv = [os.path.join(bin_dir, "riskkv-node"), "--model", model,
                     "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                     "--port-file", self.ports] + list(flags)
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=self._log)
        deadline = time.time() + start_timeout
        while time.time() < deadline:
            if os.path.exists(self.ports) and os.path.getsize(self.ports) > 0:
                grpc_port, metrics_port = open(self.ports).read().split()[:2]
                self.addr = "127.0.0.1:" + grpc_port
                self.metrics_url = "http://127.0.0.1:%s/metrics" % metrics_port
                return
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited on start:\n%s" % (name, self.log_tail()))
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("%s did not write its ports in %.0f s" % (name, start_timeout))

    def log_tail(self, lines=20):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")

    def client(self):
        return NodeClient(self.addr)

    def metrics(self):
        """{sample name: value summed over its label sets} and {(name, labels): value}."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return parse_prometheus(text)

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Metrics(dict):
    """Sample name -> value summed over label sets; .labelled holds (name, labels) -> value."""

    def __init__(self):
        super().__init__()
        self.labelled = {}

    def get_labelled(self, name, contains):
        return sum(v for (n, labels), v in self.labelled.items()
                   if n == name and contains in labels)


def parse_prometheus(text):
    out = Metrics()
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
        out.labelled[(m.group(1), m.group(2) or "")] = value
    return out


def histogram_delta(before, after, name, labels=None):
    """(count, sum, mean) of a histogram's observations between two scrapes (mean None: none)."""
    def pick(m, suffix):
        if labels is None:
            return m.get(name + suffix, 0.0)
        return m.get_labelled(name + suffix, labels)

    count = pick(after, "_count") - pick(before, "_count")
    total = pick(after, "_sum") - pick(before, "_sum")
    return count, total, (total / count if count > 0 else None)


class NodeClient:
    """The riskkv.v1.Node methods, messages built from the descriptors the node reflects."""

    def __init__(self, addr):
        self.addr = addr
        self.channel = grpc.insecure_channel(addr)
        db = ProtoReflectionDescriptorDatabase(self.channel)
        if NODE_SERVICE not in set(db.get_services()):
            raise RuntimeError("%s does not serve %s" % (addr, NODE_SERVICE))
        self.pool = descriptor_pool.DescriptorPool(db)
        self._methods = {}

    def _method(self, name):
        if name not in self._methods:
            m = self.pool.FindServiceByName(NODE_SERVICE).FindMethodByName(name)
            req = message_factory.GetMessageClass(m.input_type)
            resp = message_factory.GetMessageClass(m.output_type)
            make = self.channel.unary_stream if m.server_streaming else self.channel.unary_unary
            call = make("/%s/%s" % (NODE_SERVICE, name), request_serializer=req.SerializeToString,
                        response_deserializer=resp.FromString)
            self._methods[name] = (req, call)
        return self._methods[name]

    def call(self, name, request, timeout=300):
        """A unary call; request and reply as dicts in proto3 JSON names."""
        req, call = self._method(name)
        reply = call(json_format.ParseDict(request, req()), timeout=timeout)
        return json_format.MessageToDict(reply)

    def start(self, token_ids=None, prompt=None, timeout=300):
        request = {"tokenIds": list(token_ids)} if token_ids is not None else {"prompt": prompt}
        return self.call("StartSession", request, timeout)

    def session(self, sid, with_tokens=False):
        return self.call("GetSession", {"sessionId": sid, "withTokens": with_tokens})

    def close(self, sid):
        return self.call("CloseSession", {"sessionId": sid})

    def generate(self, sid, max_tokens, timeout=3600):
        """The server stream of GenerateReply messages (cancel() it to stop early)."""
        req, call = self._method("Generate")
        return call(req(session_id=sid, max_tokens=max_tokens), timeout=timeout)

    def migrate(self, sid, target, mode, live=None, wire_form=None, timeout=600):
        """mode: FULL_KV, RECONSTRUCT, TOKEN_REPLAY or AUTO; wire_form (FULL_KV's): plain, int8
        or int4."""
        request = {"sessionId": sid, "targetAddress": target, "mode": mode}
        if live is not None:
            request["live"] = live
        if wire_form:
            request["wireForm"] = "KV_WIRE_" + wire_form.upper()
        return self.call("Migrate", request, timeout)


def histogram_max_range(before, after, name):
    """(lo, hi]: the bucket bounds the largest observation between two scrapes lies in, from the
    cumulative `le` buckets (None when nothing was observed)."""
    deltas = {}
    for (n, labels), v in after.labelled.items():
        m = re.search(r'le="([^"]+)"', labels)
        if n == name + "_bucket" and m:
            le = float(m.group(1))
            deltas[le] = deltas.get(le, 0.0) + v - before.labelled.get((n, labels), 0.0)
    total = deltas.get(float("inf"), 0.0)
    if total <= 0:
        return None
    lo = 0.0
    for le in sorted(deltas):
        if deltas[le] >= total:
            return (lo, le)
        lo = le
    return None

#!/usr/bin/env python3
"""A gRPC client the project did not generate: PyPI grpcio with server reflection, no compiled stubs.

Asks a riskkv-node what it serves, checks its health, starts a session, generates, sends one
oversized request (which the node must refuse with RESOURCE_EXHAUSTED and survive), and migrates
the session to another node. Prints the Migrate reply as JSON; exits non-zero on any failure.

    reflection_client.py SOURCE_ADDR TARGET_ADDR [MODE]
"""
import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def method(channel, pool, service, name, streaming=False):
    m = pool.FindServiceByName(service).FindMethodByName(name)
    req = message_factory.GetMessageClass(m.input_type)
    resp = message_factory.GetMessageClass(m.output_type)
    make = channel.unary_stream if streaming else channel.unary_unary
    call = make(f"/{service}/{name}", request_serializer=req.SerializeToString,
                response_deserializer=resp.FromString)
    return req, call


def main() -> int:
    source, target = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "TOKEN_REPLAY"
    channel = grpc.insecure_channel(source)
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    for want in ("riskkv.v1.Node", "grpc.health.v1.Health"):
        if want not in services:
            print(f"{source} does not serve {want}: {sorted(services)}", file=sys.stderr)
            return 1
    pool = descriptor_pool.DescriptorPool(db)

    # The C++ server's built-in health service carries no descriptors for reflection to return;
    # its messages are tiny: an empty HealthCheckRequest asks about the whole server, and
    # HealthCheckResponse{status: SERVING} is the two bytes 08 01.
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda b: b, response_deserializer=lambda b: b)
    health = check(b"", timeout=10)
    if health != b"\x08\x01":
        print(f"{source} is not serving: {health!r}", file=sys.stderr)
        return 1

    req, start = method(channel, pool, "riskkv.v1.Node", "StartSession")
    info = start(json_format.ParseDict({"tokenIds": [5, 36, 67, 98, 129, 160, 191, 222]}, req()),
                 timeout=60)
    session = json_format.MessageToDict(info)["sessionId"]

    req, generate = method(channel, pool, "riskkv.v1.Node", "Generate", streaming=True)
    tokens = [r.token_id for r in generate(json_format.ParseDict(
        {"sessionId": session, "maxTokens": 4}, req()), timeout=60)]
    if len(tokens) != 4:
        print(f"generated {tokens}, expected 4 tokens", file=sys.stderr)
        return 1

    # A message over the node's 8 MiB limit is refused before it reaches the service.
    req, start = method(channel, pool, "riskkv.v1.Node", "StartSession")
    try:
        start(json_format.ParseDict({"prompt": "x" * (9 << 20)}, req()), timeout=60)
        print("a 9 MiB StartSession was accepted", file=sys.stderr)
        return 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            print(f"oversized request: {e.code()} {e.details()}", file=sys.stderr)
            return 1

    req, migrate = method(channel, pool, "riskkv.v1.Node", "Migrate")
    reply = migrate(json_format.ParseDict(
        {"sessionId": session, "targetAddress": target, "mode": mode}, req()), timeout=120)
    print(json.dumps(json_format.MessageToDict(reply)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

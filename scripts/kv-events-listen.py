#!/usr/bin/env python3
"""Subscribes to a sluice (or vLLM) KV-event stream and counts what it reads until SIGTERM or
SIGINT, then prints one JSON line: batches, events by kind, payload bytes, sequence gaps.
A reading subscriber for scripts/bench-kv-events.sh; needs pyzmq and msgpack
(scripts/setup-e2e.sh installs both into .venv).

    .venv/bin/python scripts/kv-events-listen.py tcp://127.0.0.1:5557
"""

import json
import signal
import sys

import msgpack
import zmq

endpoint = sys.argv[1]
sock = zmq.Context.instance().socket(zmq.SUB)
sock.setsockopt(zmq.SUBSCRIBE, b"")
sock.connect(endpoint)
stats = {"batches": 0, "bytes": 0, "gaps": 0, "BlockStored": 0, "BlockRemoved": 0,
         "AllBlocksCleared": 0}
last = None
running = True


def stop(*_):
    global running
    running = False


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
while running:
    if not sock.poll(100):
        continue
    _, seq, payload = sock.recv_multipart()
    seq = int.from_bytes(seq, "big")
    if last is not None and seq != last + 1:
        stats["gaps"] += 1
    last = seq
    stats["batches"] += 1
    stats["bytes"] += len(payload)
    for event in msgpack.unpackb(payload)[1]:
        # A map tagged by `type` (vLLM's current format), or an array with the tag first.
        stats[event["type"] if isinstance(event, dict) else event[0]] += 1
print(json.dumps(stats), flush=True)

"""KV-cache events (`--kv-events`) read the way prefix-aware routers read vLLM's: a real libzmq
SUB socket (pyzmq) on the server's PUB socket, every message `[topic, seq, payload]` decoded
with msgpack and vLLM's field list (`vllm_events.py`: tagged maps by default, arrays with
`--kv-events-format array`), batches applied in sequence order, gaps filled from the replay
ROUTER socket with a DEALER.

- After a storm that evicts cached blocks and preempts sequences, the blocks rebuilt from the
  events alone equal the server's own (`GET /debug/kv_cache`): 0 missing, 0 extra, same parents
  and tokens. The same holds after `POST /reset_prefix_cache` (one AllBlocksCleared), for a
  subscriber that joins late (from the snapshot's sequence number) and for one rebuilt from
  the replay socket alone.
- A subscriber that stops reading loses messages (counted in
  `sluice_kv_events_dropped_total{reason="subscriber"}`), while the requests and a reading
  subscriber beside it lose nothing.
- A bad endpoint fails the start with an error naming the flag; without `--kv-events` the
  prefix cache's routes are 404s.
"""

from __future__ import annotations

import concurrent.futures
import socket
import subprocess
import threading
import time

import msgpack
import pytest
import requests
import zmq

from harness import BINARY, MODEL, SluiceServer, free_port, parse_metrics
from vllm_events import decode_event

TOPIC = "kv@10.0.0.7@smollm2"
# About 48 KV blocks of 16 tokens (see test_memory_pressure.py): 16 clients of ~13 blocks each
# keep evicting and preempting.
SMALL_POOL = "17MiB"
CLIENTS = 16
REQUESTS_PER_CLIENT = 3
MAX_TOKENS = 40


def prompt(i: int) -> str:
    # Three shared system prompts of ~120 tokens, then a part of the request's own.
    system = " ".join(f"rule{(i % 3) * 50 + j}" for j in range(40))
    own = " ".join(f"item{(i * 31 + j) % 89}" for j in range(12))
    return f"System {i % 3}: {system}\nUser {i}: {own}\nAnswer:"


def complete(url: str, i: int) -> None:
    r = requests.post(
        f"{url}/v1/completions",
        json={"prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
        timeout=300,
    )
    assert r.status_code == 200, f"request {i}: {r.status_code} {r.text[:300]}"


def storm(url: str, clients: int = CLIENTS, per_client: int = REQUESTS_PER_CLIENT) -> None:
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda i: complete(url, i), range(clients * per_client)))


def snapshot(url: str) -> dict:
    r = requests.get(f"{url}/debug/kv_cache", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def labelled(srv: SluiceServer, name: str, labels: str) -> float:
    return sum(v for n, l, v in parse_metrics(srv.metrics_text()) if n == name and labels in l)


class Replica:
    """What a subscriber knows of one server's prefix cache: hash -> (parent, tokens)."""

    def __init__(self):
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.last_seq = -1
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.block_size: int | None = None
        self.media: set[str] = set()
        # How the events were laid out: "map" (vLLM's current format) or "array".
        self.forms: set[str] = set()
        # The LoRA adapter each stored block was computed under (None: the base model).
        self.lora_names: dict[int, str | None] = {}

    def apply(self, seq: int, payload: bytes) -> None:
        assert seq == self.last_seq + 1, f"batch {seq} applied after {self.last_seq}"
        batch = msgpack.unpackb(payload)
        assert len(batch) == 3, batch  # [ts, events, data_parallel_rank]
        ts, events, dp_rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 600, ts
        assert dp_rank == 0
        for event in events:
            tag, f, form = decode_event(event)
            self.forms.add(form)
            self.counts[tag] += 1
            if tag == "BlockStored":
                hashes, parent, tokens = f["block_hashes"], f["parent_block_hash"], f["token_ids"]
                block_size = f["block_size"]
                # sluice's adapter ids are its own: routers key adapters by name.
                assert f["lora_id"] is None
                self.block_size = block_size
                self.media.add(f["medium"])
                assert len(tokens) == len(hashes) * block_size, event
                for k, h in enumerate(hashes):
                    assert h not in self.blocks, f"block {h:#x} stored twice"
                    chunk = tuple(tokens[k * block_size : (k + 1) * block_size])
                    self.blocks[h] = (parent, chunk)
                    self.lora_names[h] = f["lora_name"]
                    parent = h
            elif tag == "BlockRemoved":
                self.media.add(f["medium"])
                for h in f["block_hashes"]:
                    assert self.blocks.pop(h, None) is not None, f"block {h:#x} removed, never stored"
            elif tag == "AllBlocksCleared":
                self.blocks.clear()
            else:
                raise AssertionError(f"unknown event {event!r}")
        self.last_seq = seq

    def compare(self, snap: dict) -> None:
        server = {b["hash"]: (b["parent_hash"], tuple(b["token_ids"])) for b in snap["blocks"]}
        missing = server.keys() - self.blocks.keys()
        extra = self.blocks.keys() - server.keys()
        assert (len(missing), len(extra)) == (0, 0), (
            f"{len(missing)} blocks missing, {len(extra)} extra, of {len(server)}"
        )
        assert self.blocks == server, "same hashes but different parents or tokens"


def replay(port: int, start: int) -> list[tuple[int, bytes]]:
    """Every batch the replay socket still holds from `start` on, with a DEALER as vLLM's
    ROUTER expects: `["", seq]` out, `["", seq, payload]` back until seq is -1."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert dealer.poll(10_000), "the replay socket did not answer"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == -1:
                assert payload == b""
                return out
            out.append((seq, payload))
    finally:
        dealer.close()


class Subscriber:
    """A SUB socket applying batches in order on its own thread; a gap is filled from the
    replay socket, as vLLM's example subscriber and llm-d's indexer recover."""

    def __init__(self, pub_port: int, replay_port: int | None, topic: bytes = b"kv@"):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(f"tcp://127.0.0.1:{pub_port}")
        self.replay_port = replay_port
        self.replica = Replica()
        self.topics: set[bytes] = set()
        self.gaps_filled = 0
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start_from(self, snap: dict | None) -> "Subscriber":
        """Starts applying after `snap` (a /debug/kv_cache taken after connecting), or from 0."""
        if snap is not None and snap["last_seq"] is not None:
            self.replica.last_seq = snap["last_seq"]
            for b in snap["blocks"]:
                self.replica.blocks[b["hash"]] = (b["parent_hash"], tuple(b["token_ids"]))
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.sock.poll(50):
                    continue
                topic, seq, payload = self.sock.recv_multipart()
                seq = int.from_bytes(seq, "big")
                with self.lock:
                    self.topics.add(topic)
                    if seq <= self.replica.last_seq:
                        continue
                    if seq > self.replica.last_seq + 1:
                        assert self.replay_port is not None, f"gap before {seq} and no replay"
                        for s, p in replay(self.replay_port, self.replica.last_seq + 1):
                            if self.replica.last_seq < s < seq:
                                self.replica.apply(s, p)
                        self.gaps_filled += 1
                    self.replica.apply(seq, payload)
        except BaseException as e:  # noqa: BLE001 - reported by wait_for
            self.error = e

    def wait_for(self, seq: int | None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        target = -1 if seq is None else seq
        while time.monotonic() < deadline:
            if self.error is not None:
                raise AssertionError(f"subscriber failed: {self.error!r}") from self.error
            with self.lock:
                if self.replica.last_seq >= target:
                    return
            time.sleep(0.05)
        raise AssertionError(f"subscriber at {self.replica.last_seq}, never reached {seq}")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.sock.close()


def wait_subscribed(srv: SluiceServer, n: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (srv.metric("sluice_kv_events_subscribers") or 0) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} subscribers never connected")


def events_server_with(*args: str, name: str) -> SluiceServer:
    """A small-pool server (not started) publishing on `pub_port` with replay on
    `replay_port`, both recorded on it."""
    pub, rep = free_port(), free_port()
    srv = SluiceServer(
        "--kv-cache-memory", SMALL_POOL,
        "--kv-events", f"tcp://*:{pub}",
        "--kv-events-replay", f"tcp://*:{rep}",
        *args,
        name=name,
    )
    srv.pub_port, srv.replay_port = pub, rep
    return srv


@pytest.fixture
def events_server():
    srv = events_server_with("--kv-events-topic", TOPIC, name="kv-events")
    try:
        yield srv.start()
    finally:
        srv.close()


@pytest.mark.timeout(900)
def test_events_rebuild_the_prefix_cache_exactly(events_server):
    srv = events_server
    sub = Subscriber(srv.pub_port, srv.replay_port).start_from(None)
    try:
        wait_subscribed(srv, 1)
        storm(srv.url)
        assert srv.metric("sluice_preemptions_total") > 0, "the storm preempted nothing"
        snap = snapshot(srv.url)
        assert snap["block_size"] == 16 and snap["num_blocks"] == len(snap["blocks"]) > 0
        sub.wait_for(snap["last_seq"])
        with sub.lock:
            sub.replica.compare(snap)
            counts = dict(sub.replica.counts)
            assert sub.replica.block_size == 16
            assert sub.replica.media == {"CPU"}
            assert sub.replica.forms == {"map"}, "vLLM's current format is the default"
            assert sub.topics == {TOPIC.encode()}
        assert counts["BlockStored"] > 0 and counts["BlockRemoved"] > 0, counts
        batches = srv.metric("sluice_kv_events_batches_total")
        assert batches == snap["last_seq"] + 1
        assert labelled(srv, "sluice_kv_events_dropped_total", "queue") == 0

        # A reset is one AllBlocksCleared: the replica empties with the cache.
        r = requests.post(f"{srv.url}/reset_prefix_cache", timeout=30)
        assert r.status_code == 200 and r.json() == {"cleared_blocks": snap["num_blocks"]}
        snap = snapshot(srv.url)
        assert snap["blocks"] == []
        sub.wait_for(snap["last_seq"])
        with sub.lock:
            sub.replica.compare(snap)
            assert sub.replica.counts["AllBlocksCleared"] == 1

        # A subscriber joining now starts from the snapshot's sequence number (connected
        # first, so nothing after the snapshot can pass it by).
        late = Subscriber(srv.pub_port, srv.replay_port)
        try:
            wait_subscribed(srv, 2)
            late.start_from(snapshot(srv.url))
            storm(srv.url, clients=8, per_client=2)
            snap = snapshot(srv.url)
            for s in (sub, late):
                s.wait_for(snap["last_seq"])
                with s.lock:
                    s.replica.compare(snap)
        finally:
            late.close()

        # The replay socket alone holds every batch so far (fewer than its 10000).
        rebuilt = Replica()
        for seq, payload in replay(srv.replay_port, 0):
            rebuilt.apply(seq, payload)
        assert rebuilt.last_seq == snap["last_seq"]
        rebuilt.compare(snap)
        assert replay(srv.replay_port, snap["last_seq"] + 1) == []
        print(
            f"events: {snap['last_seq'] + 1} batches, {counts}, gaps filled {sub.gaps_filled}, "
            f"preemptions {srv.metric('sluice_preemptions_total'):.0f}"
        )
    finally:
        sub.close()


@pytest.mark.timeout(600)
def test_the_array_format_rebuilds_the_cache_too():
    """`--kv-events-format array`: vLLM's earlier positional layout, for subscribers written
    before the map format; a smaller storm, the replica equal to the cache."""
    srv = events_server_with(
        "--kv-events-format", "array", "--kv-events-topic", TOPIC, name="kv-events-array"
    ).start()
    try:
        sub = Subscriber(srv.pub_port, srv.replay_port).start_from(None)
        try:
            wait_subscribed(srv, 1)
            storm(srv.url, clients=8, per_client=2)
            snap = snapshot(srv.url)
            sub.wait_for(snap["last_seq"])
            with sub.lock:
                sub.replica.compare(snap)
                assert sub.replica.forms == {"array"}
                assert sub.replica.counts["BlockStored"] > 0
        finally:
            sub.close()
    finally:
        srv.close()


def stalled_subscriber(port: int) -> socket.socket:
    """A SUB that subscribes to everything and then never reads: a plain TCP socket speaking
    ZMTP 3.0 as libzmq does, with a small receive buffer and a small segment size (so the
    kernel's send buffer on the server's side stays small too), so the server's writes to it
    block after some tens of kilobytes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    greeting = b"\xff" + b"\x00" * 7 + b"\x01\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
    sock.sendall(greeting + b"\x00" * 32)
    got = b""
    while len(got) < 64:
        got += sock.recv(64 - len(got))
    assert got[0] == 0xFF and got[10] == 3 and got[12:16] == b"NULL", got
    ready = b"\x05READY" + b"\x0bSocket-Type" + (3).to_bytes(4, "big") + b"SUB"
    sock.sendall(bytes([0x04, len(ready)]) + ready)
    flags, size = sock.recv(2)
    body = b""
    while len(body) < size:
        body += sock.recv(size - len(body))
    assert flags == 0x04 and body.startswith(b"\x05READY") and body.endswith(b"PUB"), body
    sock.sendall(b"\x00\x01\x01")  # one frame: subscribe to every topic
    return sock


@pytest.mark.timeout(900)
def test_a_stalled_subscriber_loses_messages_and_nothing_else_does():
    srv = events_server_with("--kv-events-hwm", "1", name="kv-events-stalled").start()
    stalled = stalled_subscriber(srv.pub_port)
    sub = Subscriber(srv.pub_port, srv.replay_port, topic=b"").start_from(None)
    try:
        wait_subscribed(srv, 2)
        storm(srv.url, per_client=6)
        dropped = labelled(srv, "sluice_kv_events_dropped_total", 'reason="subscriber"')
        assert dropped > 0, "a subscriber that never reads lost nothing"
        assert labelled(srv, "sluice_kv_events_dropped_total", 'reason="queue"') == 0
        snap = snapshot(srv.url)
        sub.wait_for(snap["last_seq"])
        with sub.lock:
            sub.replica.compare(snap)
        print(f"stalled subscriber: {dropped:.0f} messages dropped; reader filled {sub.gaps_filled} gaps")
    finally:
        sub.close()
        stalled.close()
        srv.close()


def test_the_prefix_cache_routes_need_kv_events(server):
    """Without --kv-events, the listing (every cached prompt's tokens) and the reset are 404s
    in OpenAI's error shape, saying which flag serves them."""
    for method, path in (("GET", "/debug/kv_cache"), ("POST", "/reset_prefix_cache")):
        r = requests.request(method, f"{server.url}{path}", timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert "--kv-events" in r.json()["error"]["message"], r.text


def start_fails(*args: str) -> str:
    out = subprocess.run(
        [str(BINARY), "serve", "--model", str(MODEL), "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0, f"started with {args}"
    return out.stdout + out.stderr


def test_bad_kv_events_endpoints_fail_the_start():
    assert "--kv-events" in start_fails("--kv-events", "ipc:///tmp/sluice-kv")
    assert "--kv-events" in start_fails("--kv-events", "tcp://*:http")
    err = start_fails("--kv-events-replay", f"tcp://*:{free_port()}")
    assert "kv_events_replay" in err and "needs kv_events" in err, err
    err = start_fails("--kv-events", f"tcp://*:{free_port()}", "--kv-events-replay", "tcp://host:1")
    assert "kv_events_replay" in err and "must bind" in err, err
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = start_fails("--kv-events", f"tcp://*:{port}")
        assert "--kv-events" in err and "cannot bind" in err, err


def test_a_connecting_publisher_reaches_a_subscriber_that_binds(start_server):
    """`--kv-events tcp://HOST:PORT` (no wildcard) connects, as vLLM's PUB does, to one
    subscriber that binds: llm-d's indexer layout."""
    port = free_port()
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.bind(f"tcp://127.0.0.1:{port}")
    try:
        srv = start_server("--kv-events", f"tcp://127.0.0.1:{port}", name="kv-connect")
        # libzmq works a bound socket's new connections (and sends its subscriptions over
        # them) when the application next uses the socket: poll it until the server has seen
        # the subscription, as a subscriber's receive loop does.
        deadline = time.monotonic() + 30
        while (srv.metric("sluice_kv_events_subscribers") or 0) < 1:
            assert time.monotonic() < deadline, "the server never connected"
            sock.poll(50)
        for _ in range(10):
            sock.poll(50)
        complete(srv.url, 0)
        snap = snapshot(srv.url)
        replica = Replica()
        while replica.last_seq < snap["last_seq"]:
            assert sock.poll(10_000), f"no batch after {replica.last_seq}"
            topic, seq, payload = sock.recv_multipart()
            assert topic == b""
            replica.apply(int.from_bytes(seq, "big"), payload)
        replica.compare(snap)
        assert replica.counts["BlockStored"] > 0
    finally:
        sock.close()

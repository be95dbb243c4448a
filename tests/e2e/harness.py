"""Starting and watching a real `sluice serve` process for the end-to-end tests.

Nothing here builds: `scripts/test.sh` runs `cargo build --release -p sluice-server` first.
`SLUICE_BIN` and `SLUICE_MODEL` override the binary and the model file.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("SLUICE_BIN", ROOT / "target" / "release" / "sluice"))
MODEL = Path(
    os.environ.get("SLUICE_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
)
# The served model name defaults to the model file's name without its extension.
MODEL_NAME = MODEL.stem

STARTUP_TIMEOUT_S = float(os.environ.get("SLUICE_E2E_STARTUP_TIMEOUT", "180"))

# Under `CI=true` (any value but empty, 0, false or no) a test skipped for a missing input fails
# instead (conftest.py): the reasons of such skips hold MISSING_INPUT.
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
MISSING_INPUT = "skipped:"


def served(*args: str, name: str, model: Path | None = None):
    """A module fixture's body: `yield from served(...)` starts a server of the module's own,
    yields it, and stops it after the module's tests."""
    srv = SluiceServer(*args, name=name, model=model)
    try:
        srv.start()
        yield srv
    finally:
        srv.close()


def _ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections as their source ports."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


_EPHEMERAL = _ephemeral_ports()
_handed_out: set[int] = set()
_pick = random.Random(os.getpid())


def free_port() -> int:
    """A TCP port that nothing is bound to right now, on any address, and that no outgoing
    connection will take before a server binds it.

    Not one the kernel picks (bind to port 0): those come from the ephemeral range, which
    outgoing connections draw their source ports from. A server told to listen on such a port
    fails with "address in use" when, between the choice and its bind, a connection (another
    server's /health poll) took the port as its source; a source port stays bound in TIME_WAIT
    for a minute after the connection closed, SO_REUSEADDR or not. CI failed so once."""
    below = range(10000, _EPHEMERAL.start)
    candidates = below if len(below) >= 1000 else range(max(_EPHEMERAL.stop, 10000), 65536)
    for _ in range(1000):
        port = _pick.choice(candidates)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                # The wildcard address: a bind to it conflicts with one to any address, so a
                # port free here is free for `tcp://*:PORT` and for 127.0.0.1 alike.
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise AssertionError(f"no free TCP port in {candidates}")


class SluiceServer:
    """One `sluice serve` child process on 127.0.0.1 with its log in a temp file."""

    def __init__(
        self,
        *args: str,
        name: str = "sluice",
        model: Path | str | None = None,
        env: dict[str, str] | None = None,
    ):
        self.args = list(args)
        self.name = name
        # The model file or Hugging Face directory to serve (default: MODEL); a str is a hub
        # name (test_hub.py), fetched by the server itself.
        self.model = model if isinstance(model, str) else Path(model) if model else MODEL
        # Variables set for this server beside the environment's (HF_ENDPOINT, HF_HOME...).
        self.env = dict(env or {})
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._logdir = tempfile.TemporaryDirectory(prefix=f"sluice-e2e-{name}-")
        self.log_path = Path(self._logdir.name) / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        return [
            str(BINARY),
            "serve",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]

    def start(self, timeout: float = STARTUP_TIMEOUT_S, wait: bool = True) -> "SluiceServer":
        if not BINARY.is_file():
            raise AssertionError(
                f"{BINARY} does not exist: build it first with "
                "`cargo build --release -p sluice-server` (scripts/test.sh does)"
            )
        if isinstance(self.model, Path) and not self.model.exists():
            raise AssertionError(f"{self.model} does not exist: run ./scripts/fetch-model.sh")
        # The server reads SLUICE_* variables as configuration: only the flags given here count.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.setdefault("RUST_BACKTRACE", "1")
        # A panic's backtrace, but not the one anyhow takes of an error that ends the start:
        # that one fills the log's tail and hides the error's message.
        env.setdefault("RUST_LIB_BACKTRACE", "0")
        env.update(self.env)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Not the checkout: a local config/sluice.toml must not change what is tested.
            cwd=self._logdir.name,
        )
        log.close()
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise AssertionError(
                    f"sluice exited with code {code} before /health answered 200\n"
                    f"command: {' '.join(self.command())}\n{self.log_tail()}"
                )
            try:
                r = requests.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    return
                last = f"/health answered {r.status_code}: {r.text[:200]!r}"
            except requests.RequestException as e:
                last = f"/health: {type(e).__name__}"
            time.sleep(0.2)
        self.kill()
        raise AssertionError(
            f"sluice did not answer /health with 200 within {timeout:.0f} s ({last})\n"
            f"command: {' '.join(self.command())}\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no server log: {e})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last {lines} lines of the {self.name} server log ---\n{tail}\n---"

    def terminate(self) -> None:
        """SIGTERM, as a process supervisor stops the server."""
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.kill()
        self._logdir.cleanup()

    # --- /metrics ----------------------------------------------------------------------------

    def metrics_text(self) -> str:
        r = requests.get(f"{self.url}/metrics", timeout=10)
        assert r.status_code == 200, f"/metrics answered {r.status_code}: {r.text[:300]}"
        return r.text

    def metric(self, name: str) -> float | None:
        """The sum of every sample of `name` (all label sets); None when it is absent."""
        return metric_value(self.metrics_text(), name)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$")


def parse_metrics(text: str) -> list[tuple[str, str, float]]:
    """(name, labels, value) for every sample line of a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            samples.append((m.group(1), m.group(2) or "", float(m.group(3))))
    return samples


def metric_value(text: str, name: str) -> float | None:
    values = [v for n, _, v in parse_metrics(text) if n == name]
    return sum(values) if values else None


def metric_names(text: str) -> set[str]:
    return {n for n, _, _ in parse_metrics(text)}


def run_together(fn, items: list, timeout: float = 240) -> list:
    """`fn(item)` for every item at once, one thread each, started together behind a barrier;
    each result, or the exception it raised. Fails if a call is still running at `timeout`."""
    results: list = [None] * len(items)
    barrier = threading.Barrier(len(items))

    def run(i: int):
        barrier.wait()
        try:
            results[i] = fn(items[i])
        except Exception as e:  # noqa: BLE001 - returned to the caller, which reports it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a concurrent call hung"
    return results

"""Fixtures: a shared `sluice serve` for most tests, and a factory for tests that need their own
server (API key, tiny queue, SIGTERM). Every server started here is killed at teardown; a failing
test's report carries the tail of each server log it used."""

from __future__ import annotations

import openai
import pytest

from harness import IN_CI, MISSING_INPUT, MODEL_NAME, SluiceServer


@pytest.fixture(scope="session")
def server():
    srv = SluiceServer(name="shared")
    try:
        srv.start()
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key="sk-not-checked", max_retries=0, timeout=120
    )


@pytest.fixture(scope="session")
def model_name() -> str:
    return MODEL_NAME


class ServerFactory:
    def __init__(self):
        self.servers: list[SluiceServer] = []

    def __call__(self, *args: str, name: str = "own") -> SluiceServer:
        # A small KV pool: these servers run a handful of sequences.
        srv = SluiceServer("--kv-cache-memory", "128MiB", *args, name=name)
        self.servers.append(srv)
        return srv.start()

    def close(self):
        for srv in self.servers:
            srv.close()


@pytest.fixture
def start_server():
    """`start_server("--api-key", "k")` starts (and waits for) a server of the test's own."""
    factory = ServerFactory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        # A skip for a missing input (a model, the node clients, a namespace) says so with
        # "skipped:" in its reason; in CI, where scripts/test.sh provides every input, it is a
        # failure naming what is missing, never a pass.
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if MISSING_INPUT in reason:
            report.outcome = "failed"
            report.longrepr = f"CI is set and an input of this test is missing: {reason}"
    if not report.failed:
        return
    servers = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, SluiceServer):
            servers.append(value)
        elif isinstance(value, ServerFactory):
            servers.extend(value.servers)
    for srv in servers:
        report.sections.append((f"{srv.name} server log ({report.when})", srv.log_tail(40)))

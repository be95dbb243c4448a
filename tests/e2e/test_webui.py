"""The chat page at `/` in a real browser: Playwright drives Debian's Chromium against sluice.

Checks that the page loads under its Content-Security-Policy with no console error and no failed
request (and fits a phone's width); that an answer streams into the page token by token; that
Stop aborts the request and the server frees the sequence; that Regenerate and Edit-and-resend
work; that conversations survive a reload (localStorage), switch, export as JSON and delete; that
model output is shown as text and never runs as HTML (a routed stream carries `<script>` and
`<img onerror>`); that the API-key prompt refuses a wrong key and accepts the right one on a server
started with `--api-key`; and that `--webui off` serves no page.

Each browser test saves a screenshot to target/webui/NAME.png (answer.png is the one in docs/).
The timing test writes target/webui/timings.json: over several rounds, send to first delta and
to first paint in the page, beside the API's own time to first token for the same kind of request
made with `requests`, and their medians. They are measurements, printed and kept, never asserted
on.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import requests

from harness import MISSING_INPUT, MODEL_NAME, ROOT

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the skip below says so
    sync_playwright = None

CHROMIUM = Path(os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium"))
OUT = ROOT / "target" / "webui"
RUNNING = "vllm:num_requests_running"

CSP = {
    "default-src": ["'none'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "connect-src": ["'self'"],
    "img-src": ["'self'", "data:", "blob:"],
    "base-uri": ["'none'"],
    "form-action": ["'none'"],
    "frame-ancestors": ["'none'"],
}

needs_browser = pytest.mark.skipif(
    sync_playwright is None or not CHROMIUM.is_file(),
    reason=f"{MISSING_INPUT} Playwright (tests/e2e/requirements.txt) or {CHROMIUM} is missing: "
    "run scripts/setup-e2e.sh",
)


def parse_csp(value: str) -> dict[str, list[str]]:
    out = {}
    for part in value.split(";"):
        words = part.split()
        if words:
            out[words[0].lower()] = words[1:]
    return out


# --- the browser ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page and what it did: console errors, uncaught exceptions, failed requests (network
    failures and answers >= 400), dialogs (dismissed) and every request URL."""

    def __init__(self, page):
        self.page = page
        self.errors: list[str] = []
        self.failed: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.failed.append(f"{r.method} {r.url}: {r.failure}"))
        page.on("response", self._response)
        page.on("dialog", self._dialog)
        page.on("request", lambda r: self.requests.append(r.url))

    def _console(self, msg):
        if msg.type == "error":
            self.errors.append(f"console.error: {msg.text}")

    def _response(self, r):
        if r.status >= 400:
            self.failed.append(f"{r.request.method} {r.url}: {r.status}")

    def _dialog(self, d):
        self.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    def page_errors(self) -> list[str]:
        return [e for e in self.errors if e.startswith("pageerror")]


@pytest.fixture
def ui(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        yield Watched(page)
    finally:
        context.close()


def shot(page, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT / f"{name}.png"))


def open_page(w: Watched, url: str) -> None:
    response = w.page.goto(f"{url}/")
    assert response is not None and response.status == 200, f"GET / answered {response}"
    wait_models(w.page)


def wait_models(page) -> None:
    """Until /v1/models filled the model picker."""
    page.wait_for_function("() => document.querySelector('#model').value !== ''")


def settings(page, *, max_tokens=None, temperature=None, system=None) -> None:
    panel = page.locator("#settings")
    if panel.is_hidden():
        page.click("#toggle-settings")
    if max_tokens is not None:
        page.fill("#max-tokens", str(max_tokens))
    if temperature is not None:
        page.fill("#temperature", str(temperature))
    if system is not None:
        page.fill("#system", system)
    page.click("#toggle-settings")


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


LAST_ANSWER = "[...document.querySelectorAll('.message.assistant')].pop()"


def wait_answer(page, timeout_ms: int = 180_000) -> dict:
    """Waits until the last answer is no longer streaming; its data attributes and text."""
    page.wait_for_function(
        f"() => {{ const m = {LAST_ANSWER}; return m && m.dataset.state !== 'streaming'; }}",
        timeout=timeout_ms,
    )
    return answer(page)


def answer(page) -> dict:
    return page.evaluate(
        f"""() => {{
            const m = {LAST_ANSWER};
            if (!m) return null;
            return {{
                data: {{...m.dataset}},
                text: m.querySelector(':scope > .content').textContent,
                stats: m.querySelector(':scope > .stats').textContent,
                error: m.querySelector(':scope > .error-text').textContent,
            }};
        }}"""
    )


def poll(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what} (last seen: {last!r})")


# --- the tests -----------------------------------------------------------------------------------


@needs_browser
def test_page_loads_under_csp(server, ui):
    page = ui.page
    response = page.goto(f"{server.url}/")
    assert response.status == 200
    headers = response.headers
    assert "content-security-policy" in headers, f"GET / has no CSP: {headers}"
    assert parse_csp(headers["content-security-policy"]) == CSP, headers["content-security-policy"]
    assert headers.get("x-content-type-options") == "nosniff"

    total = len(response.body())
    for path, kind in (("/webui/app.js", "javascript"), ("/webui/style.css", "css")):
        r = requests.get(f"{server.url}{path}", timeout=10)
        assert r.status_code == 200, f"GET {path}: {r.status_code}"
        assert kind in r.headers.get("content-type", ""), r.headers
        assert parse_csp(r.headers.get("content-security-policy", "")) == CSP, path
        assert r.headers.get("x-content-type-options") == "nosniff", path
        total += len(r.content)
    assert total < 200_000, f"the page's three files are {total} bytes"

    wait_models(page)
    options = page.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    assert MODEL_NAME in options, options
    # SmolLM2's card lists no image input: no attach control.
    assert page.locator("#attach").is_hidden()
    assert page.locator("#prompt").is_visible() and page.locator("#send").is_visible()
    assert page.locator("#stop").is_hidden()
    assert page.locator("#api-key-form").is_hidden()
    shot(page, "page")

    # A phone's width: nothing wider than the screen, the conversation list behind a button.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    wait_models(page)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.locator("#toggle-sidebar").is_visible()
    assert page.locator("#prompt").is_visible() and page.locator("#send").is_visible()
    assert not page.locator("#new-chat").is_visible()
    assert page.evaluate("document.querySelector('#new-chat').getBoundingClientRect().right <= 0")
    shot(page, "phone")
    page.click("#toggle-sidebar")
    page.wait_for_function(
        "() => document.querySelector('#new-chat').getBoundingClientRect().left >= 0"
    )
    page.wait_for_timeout(300)  # the slide-in transition
    shot(page, "phone-sidebar")

    assert not ui.errors, ui.errors
    assert not ui.failed, ui.failed
    assert not ui.dialogs, ui.dialogs


PROMPT = "Write a Python function that reverses a string, and explain it in one sentence."
STREAM_TOKENS = 96
# The timed rounds: prompts of one shape, each asked once, so that no answer starts from a
# cached prefix of another's beyond the chat template's (cached for all after the first).
LANGUAGES = ["Rust", "Go", "C", "Java", "Ruby", "Lua", "Perl", "Haskell", "Scala", "Swift",
             "Kotlin", "Dart"]
ROUNDS = 6
TIMED_TOKENS = 8


def timed_prompt(language: str) -> str:
    return f"Write a {language} function that reverses a string, and explain it in one sentence."


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return round(xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2, 1)


def api_ttft(server, prompt: str, max_tokens: int) -> dict:
    """The page's kind of request made straight to the API: time to the first content delta, and
    tokens."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    tokens = None
    with requests.post(
        f"{server.base_url}/chat/completions", json=body, stream=True, timeout=120
    ) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens")
            for c in chunk.get("choices") or []:
                d = c.get("delta") or {}
                if first is None and (d.get("content") or d.get("reasoning_content")):
                    first = time.perf_counter()
    end = time.perf_counter()
    return {
        "ttft_ms": round((first - t0) * 1000, 1) if first else None,
        "total_ms": round((end - t0) * 1000, 1),
        "completion_tokens": tokens,
    }


@needs_browser
def test_answer_streams(server, ui):
    page = ui.page
    # One token first, so that neither timed request is the server's first (a cold start).
    r = requests.post(
        f"{server.base_url}/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Hi."}],
            "max_tokens": 1,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    open_page(ui, server.url)
    settings(page, max_tokens=STREAM_TOKENS, temperature=0)
    # Every change to the last answer's text, with the answer's state at that moment.
    page.evaluate(
        """() => {
            window.__seen = [];
            const log = document.querySelector('#messages');
            new MutationObserver(() => {
                const m = [...log.querySelectorAll('.message.assistant')].pop();
                if (!m) return;
                const c = m.querySelector(':scope > .content');
                window.__seen.push([m.dataset.state, c.textContent.length]);
            }).observe(log, {subtree: true, childList: true, characterData: true});
        }"""
    )
    send(page, PROMPT)
    page.wait_for_selector(".message.assistant.streaming")
    a = wait_answer(page)
    assert a["data"]["state"] == "done", a
    assert a["text"].strip(), a
    seen = page.evaluate("window.__seen")
    growing = sorted({n for state, n in seen if state == "streaming" and n > 0})
    assert len(growing) >= 2, (
        f"the answer did not grow while streaming (lengths seen while streaming: {growing}, "
        f"final {len(a['text'])})"
    )
    assert int(a["data"]["tokens"]) > 0, a
    assert "tok/s" in a["stats"] and "TTFT" in a["stats"], a["stats"]
    user = page.locator(".message.user .content").last.text_content()
    assert user == PROMPT
    page.locator(".message.assistant").last.scroll_into_view_if_needed()
    shot(page, "answer")

    assert not ui.errors, ui.errors
    assert not ui.failed, ui.failed


@needs_browser
def test_first_token_timings_beside_the_api(server, ui):
    """Send to the first token on screen, beside the API's own time to first token: ROUNDS
    rounds, each a page request and a direct one (`requests`) on prompts of one shape, the order
    alternating, medians kept in target/webui/timings.json. Measured, never asserted on."""
    page = ui.page
    r = requests.post(
        f"{server.base_url}/chat/completions",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    open_page(ui, server.url)
    settings(page, max_tokens=TIMED_TOKENS, temperature=0)
    rounds = []
    for i in range(ROUNDS):
        page_prompt, api_prompt = timed_prompt(LANGUAGES[2 * i]), timed_prompt(LANGUAGES[2 * i + 1])

        def in_page() -> dict:
            page.click("#new-chat")
            send(page, page_prompt)
            a = wait_answer(page)
            assert a["data"]["state"] == "done", a
            d = {k: float(v) for k, v in a["data"].items() if k in ("tSend", "tFirstChunk", "tFirstRender")}
            return {
                "send_to_first_delta_ms": round(d["tFirstChunk"] - d["tSend"], 1),
                "send_to_first_paint_ms": round(d["tFirstRender"] - d["tSend"], 1),
            }

        if i % 2 == 0:
            p, api = in_page(), api_ttft(server, api_prompt, TIMED_TOKENS)
        else:
            api, p = api_ttft(server, api_prompt, TIMED_TOKENS), in_page()
        assert api["ttft_ms"] is not None, api
        rounds.append({"page": p, "api_ttft_ms": api["ttft_ms"]})
    paint = [r["page"]["send_to_first_paint_ms"] for r in rounds]
    delta = [r["page"]["send_to_first_delta_ms"] for r in rounds]
    api = [r["api_ttft_ms"] for r in rounds]
    timings = {
        "model": MODEL_NAME,
        "max_tokens": TIMED_TOKENS,
        "rounds": rounds,
        "median": {
            "page_send_to_first_delta_ms": median(delta),
            "page_send_to_first_paint_ms": median(paint),
            "api_ttft_ms": median(api),
            "page_paint_minus_api_ms": round(median(paint) - median(api), 1),
        },
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"web UI timings (measured, not asserted): {json.dumps(timings['median'])}")
    assert not ui.errors, ui.errors
    assert not ui.failed, ui.failed


@needs_browser
def test_stop_aborts_and_frees_the_sequence(server, ui):
    page = ui.page
    assert server.metric(RUNNING) is not None, f"/metrics has no {RUNNING}"
    poll(lambda: server.metric(RUNNING) == 0, 60, "the server is busy before the test")
    open_page(ui, server.url)
    settings(page, max_tokens=2000, temperature=0)
    # SmolLM2 at temperature 0 writes all 2000 tokens of this story (checked through the
    # API); it answered "count from 1 to 2000" in 17, which could end between the checks below.
    send(page, "Write a long story about a dragon who learns to sing. Make it at least 1500 words.")
    page.wait_for_function(
        f"() => {{ const m = {LAST_ANSWER}; return m && "
        "m.querySelector(':scope > .content').textContent.length > 0; }"
    )
    poll(lambda: server.metric(RUNNING) >= 1, 30, f"{RUNNING} never showed the request")
    assert answer(page)["data"]["state"] == "streaming", "the answer ended before Stop"
    assert page.locator("#stop").is_visible() and page.locator("#send").is_hidden()
    page.click("#stop")
    a = wait_answer(page, timeout_ms=30_000)
    assert a["data"]["state"] == "stopped", a
    assert "stopped" in a["stats"], a["stats"]
    assert page.locator("#stop").is_hidden() and page.locator("#send").is_visible()
    poll(
        lambda: server.metric(RUNNING) == 0,
        30,
        f"{RUNNING} did not come back to 0 after Stop: the sequence still runs",
    )
    # Nothing more arrives after Stop.
    page.wait_for_timeout(500)
    assert answer(page)["text"] == a["text"]
    shot(page, "stop")
    assert not ui.page_errors(), ui.errors


@needs_browser
def test_regenerate_and_edit(server, ui):
    page = ui.page
    open_page(ui, server.url)
    settings(page, max_tokens=12, temperature=0.8)
    send(page, "Name a fruit.")
    assert wait_answer(page)["data"]["state"] == "done"
    page.click(".message.assistant .regenerate")
    a = wait_answer(page)
    assert a["data"]["state"] == "done" and a["text"].strip(), a
    assert page.locator(".message").count() == 2

    page.click(".message.user .edit")
    page.fill(".message.user .edit-input", "Name a vegetable.")
    page.click(".message.user .save-edit")
    a = wait_answer(page)
    assert a["data"]["state"] == "done" and a["text"].strip(), a
    assert page.locator(".message").count() == 2
    assert page.locator(".message.user .content").text_content() == "Name a vegetable."
    # Edit-and-resend cuts the conversation at the edited message: a follow-up, then an edit
    # of the first message, leaves two messages again.
    send(page, "And another one?")
    wait_answer(page)
    assert page.locator(".message").count() == 4
    page.locator(".message.user .edit").first.click()
    page.fill(".message.user .edit-input", "Name a colour.")
    page.click(".message.user .save-edit")
    wait_answer(page)
    assert page.locator(".message").count() == 2
    shot(page, "edit")
    assert not ui.errors, ui.errors
    assert not ui.failed, ui.failed


@needs_browser
def test_conversations_survive_reload(server, ui):
    page = ui.page
    open_page(ui, server.url)
    settings(page, max_tokens=16, temperature=0)
    send(page, "Say hello.")
    first = wait_answer(page)
    assert first["data"]["state"] == "done"

    page.reload()
    wait_models(page)
    assert page.locator(".message.user .content").all_text_contents() == ["Say hello."]
    assert page.locator(".message.assistant .content").all_text_contents() == [first["text"]]
    assert page.locator("#conversations li").count() == 1
    assert page.input_value("#max-tokens") == "16", "the settings were not kept"

    page.click("#new-chat")
    assert page.locator(".message").count() == 0
    send(page, "Name a colour.")
    wait_answer(page)
    assert page.locator("#conversations li").count() == 2
    page.locator("#conversations li .open", has_text="Say hello.").click()
    assert page.locator(".message.user .content").all_text_contents() == ["Say hello."]

    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"], exported
    assert exported["messages"][0]["content"] == "Say hello."
    stored = page.evaluate("JSON.parse(localStorage.getItem('sluice.conversations'))")
    stored = next(c for c in stored if c["messages"][0]["content"] == "Say hello.")
    assert exported["messages"][1]["content"] == stored["messages"][1]["content"]
    assert exported["messages"][1]["content"].strip()
    shot(page, "conversations")

    # Delete takes two clicks (no confirm() dialog).
    item = page.locator("#conversations li", has_text="Say hello.")
    item.locator(".delete").click()
    item.locator(".delete").click()
    assert page.locator("#conversations li").count() == 1
    page.reload()
    wait_models(page)
    assert page.locator("#conversations li").count() == 1
    assert not ui.errors, ui.errors
    assert not ui.failed, ui.failed
    assert not ui.dialogs, ui.dialogs


# Model output that would run if it were ever parsed as HTML, split across chunks.
XSS_CONTENT = [
    "Look: <scr",
    "ipt>alert(1)</scr",
    "ipt> and <img src=x onerr",
    "or=\"fetch('/xss')\">",
    " and [a link](javascript:alert(1)) and **<b>bold</b>**",
    "\n\n```html\n<script>alert(2)</script>\n```\n",
    "\n<iframe src=\"https://example.com/\"></iframe>",
]
XSS_REASONING = ["<img src=x ", "onerror=alert(3)>"]
XSS_TOOL = {"name": "<svg onload=alert(4)>", "arguments": '{"x": "<script>alert(5)</script>"}'}


def xss_stream() -> str:
    def event(delta=None, finish=None, usage=None):
        chunk = {"id": "chatcmpl-xss", "object": "chat.completion.chunk", "model": MODEL_NAME}
        choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
        chunk["choices"] = [] if usage else [choice]
        if usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk)}\n\n"

    parts = [event({"role": "assistant", "content": ""})]
    parts += [event({"reasoning_content": r}) for r in XSS_REASONING]
    parts.append(
        event(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_x", "type": "function",
                     "function": {"name": XSS_TOOL["name"], "arguments": ""}}
                ]
            }
        )
    )
    parts.append(
        event({"tool_calls": [{"index": 0, "function": {"arguments": XSS_TOOL["arguments"]}}]})
    )
    parts += [event({"content": c}) for c in XSS_CONTENT]
    parts.append(event({}, "stop"))
    n = len(XSS_CONTENT) + len(XSS_REASONING) + 2
    parts.append(event(usage={"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}))
    parts.append("data: [DONE]\n\n")
    return "".join(parts)


@needs_browser
def test_model_output_is_never_html(server, ui):
    page = ui.page
    body = xss_stream()
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            body=body,
        ),
    )
    open_page(ui, server.url)
    send(page, "Say something dangerous.")
    a = wait_answer(page)
    assert a["data"]["state"] == "done", a
    page.wait_for_timeout(500)  # time for any image load or handler to fire

    def check():
        msg = page.locator(".message.assistant").last
        text = msg.locator(".content").text_content()
        assert "<script>alert(1)</script>" in text, text
        assert "<img src=x onerror=\"fetch('/xss')\">" in text, text
        assert "[a link](javascript:alert(1))" in text, text
        assert "<b>bold</b>" in text, text
        assert "<iframe" in text, text
        assert "<script>alert(2)</script>" in msg.locator(".content pre code").text_content()
        assert "<img src=x onerror=alert(3)>" in msg.locator(".reasoning").text_content()
        tool = msg.locator(".tool-call").text_content()
        assert XSS_TOOL["name"] in tool and "<script>alert(5)</script>" in tool, tool
        bad = msg.locator("img, script, svg, iframe, b, object, embed, style, link").count()
        assert bad == 0, f"{bad} element(s) made from model output"
        hrefs = page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
        assert not [h for h in hrefs if not h.startswith(("http://", "https://"))], hrefs
        assert not ui.dialogs, ui.dialogs
        assert not [u for u in ui.requests if "/xss" in u], ui.requests
        foreign = [u for u in ui.requests if not u.startswith(f"{server.url}/")]
        assert not foreign, f"requests off the page's origin: {foreign}"

    check()
    shot(page, "xss")
    # The stored conversation renders the same way after a reload.
    page.reload()
    wait_models(page)
    page.wait_for_timeout(300)
    check()
    assert not ui.errors, ui.errors
    assert not ui.failed, ui.failed


@needs_browser
def test_api_key_prompt(start_server, ui):
    key = "sk-webui-right"
    srv = start_server("--api-key", key, name="api-key")
    page = ui.page
    response = page.goto(f"{srv.url}/")
    assert response.status == 200, "the page itself must not need the key"
    page.wait_for_selector("#api-key-form", state="visible")
    assert page.locator("#api-key-error").is_hidden()
    shot(page, "api-key")

    page.fill("#api-key", "sk-webui-wrong")
    page.press("#api-key", "Enter")
    page.wait_for_selector("#api-key-error", state="visible")
    assert page.locator("#api-key-error").text_content().strip()
    assert page.locator("#api-key-form").is_visible()
    assert page.evaluate("localStorage.getItem('sluice.apiKey')") is None

    page.fill("#api-key", key)
    page.click("#api-key-save")
    page.wait_for_selector("#api-key-form", state="hidden")
    wait_models(page)
    assert page.evaluate("localStorage.getItem('sluice.apiKey')") == key
    settings(page, max_tokens=8)
    send(page, "Hello!")
    a = wait_answer(page)
    assert a["data"]["state"] == "done" and a["text"].strip(), a

    # The key is kept: a reload asks for nothing.
    page.reload()
    wait_models(page)
    assert page.locator("#api-key-form").is_hidden()
    # Only the two refused /v1/models calls failed (401), and nothing threw.
    assert not ui.page_errors(), ui.errors
    assert all(": 401" in f for f in ui.failed), ui.failed


def test_webui_off_serves_no_page(start_server):
    srv = start_server("--webui", "off", name="webui-off")
    for path in ("/", "/webui/app.js", "/webui/style.css"):
        r = requests.get(f"{srv.url}{path}", timeout=10)
        assert r.status_code == 404, f"GET {path} with --webui off: {r.status_code}"
    assert requests.get(f"{srv.url}/health", timeout=10).status_code == 200

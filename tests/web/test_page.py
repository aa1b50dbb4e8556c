"""The page at `/` in a real browser (headless Chromium through Playwright) against real
`tandem serve` processes on tiny models.

What the page shows must be what the API says: the tests send the same seeded request through
the API and compare the page's token marks (origin, id, logprob, rejected guess) with the
response's `spec_decode_token_origin` lists, and its figures with the response's metrics.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import httpx

from entrypoints.server_helpers import API_KEY, ServerProcess
from tandem.entrypoints.openai.errors import OpenAIError, sse_error
from tandem.entrypoints.openai.sse import parse_sse
from web.browser_helpers import SCREENSHOTS, WebServers

PROMPT = "The future of AI is"
TIMEOUT_MS = 30_000

# The DOM the tests read: every token in #output, in order.
TOKENS_JS = """() => [...document.querySelectorAll('#output [data-origin]')].map(e => ({
    origin: e.dataset.origin, kind: e.dataset.kind, id: Number(e.dataset.tokenId),
    logprob: e.dataset.logprob === undefined ? null : Number(e.dataset.logprob),
    rejected: e.dataset.rejected === undefined ? null : e.dataset.rejected,
    text: e.textContent}))"""
COUNT = "document.querySelectorAll('#output [data-origin]').length"
COUNT_JS = f"() => {COUNT}"


def open_page(page: Any, srv: ServerProcess) -> None:
    page.goto(srv.url + "/")
    page.wait_for_function("document.getElementById('model-name').textContent === "
                           f"{srv.model!r}", timeout=TIMEOUT_MS)
    page.wait_for_function("!document.getElementById('draft-status').textContent"
                           ".startsWith('reading')", timeout=TIMEOUT_MS)


def fill_request(page: Any, mode: str, prompt: str, max_tokens: int, seed: int,
                 temperature: float = 1.0, ignore_eos: bool = True) -> None:
    page.check(f"#mode-{mode}")
    page.fill("#prompt", prompt)
    page.fill("#temperature", str(temperature))
    page.fill("#top-p", "1")
    page.fill("#top-k", "0")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#seed", str(seed))
    page.set_checked("#ignore-eos", ignore_eos)


def wait_done(page: Any) -> None:
    page.wait_for_selector("#status[data-state=done]", timeout=TIMEOUT_MS)


def api_tokens(choice: dict, chat: bool) -> list[dict]:
    """The API's view of a choice in the shape of TOKENS_JS."""
    if chat:
        texts = [t["token"] for t in choice["logprobs"]["content"]]
        logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    else:
        texts, logprobs = choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]
    return [{"origin": o, "id": i, "logprob": lp, "rejected": r, "text": t}
            for o, i, lp, r, t in zip(choice["spec_decode_token_origin"],
                                      choice["spec_decode_token_ids"], logprobs,
                                      choice["spec_decode_rejected_draft"], texts, strict=True)]


def assert_same_tokens(shown: list[dict], expected: list[dict]) -> None:
    assert len(shown) == len(expected)
    for i, (s, e) in enumerate(zip(shown, expected)):
        assert (s["origin"], s["id"], s["rejected"]) == (e["origin"], e["id"], e["rejected"]), i
        assert math.isclose(s["logprob"], e["logprob"], rel_tol=1e-6, abs_tol=1e-6), i
        assert s["text"] == (e["text"] or "∅"), i  # an empty token shows as ∅


def percent(text: str) -> float:
    match = re.fullmatch(r"([\d.]+) %", text.strip())
    assert match, text
    return float(match.group(1)) / 100


def test_page_and_assets_need_no_key(web_servers: WebServers) -> None:
    """The page and its assets are served without the API key, with their content types, and
    reference nothing outside the server; the API itself still needs the key."""
    url = web_servers.plain.url
    page = httpx.get(url + "/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"""(src|href)=["']https?:""", page.text)  # no CDN, no network
    for asset, kind in [("app.js", "text/javascript"), ("spec.js", "text/javascript"),
                        ("api.js", "text/javascript"), ("tokens.js", "text/javascript"),
                        ("charts.js", "text/javascript"), ("style.css", "text/css"),
                        ("vendor/chart.umd.min.js", "text/javascript")]:
        r = httpx.get(f"{url}/static/{asset}", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), asset
        assert f"/static/{asset}" in page.text
    for missing in ("/static/nope.js", "/static/%2e%2e/api_server.py"):
        r = httpx.get(url + missing, timeout=10)
        assert r.status_code == 404 and "no such file" in r.json()["error"]["message"], missing
    assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(url + "/metrics", timeout=10).status_code == 200


def test_completion_marks_match_the_api(page: Any, web_servers: WebServers,
                                        screenshot_dir: Any) -> None:
    """Completion mode: tokens stream in with their marks, the marks are the API's for the same
    seeded request, hover tells a token's story, and the figures and charts update."""
    srv = web_servers.spec
    open_page(page, srv)
    assert "3 draft tokens" in page.inner_text("#draft-status")
    fill_request(page, "completion", PROMPT, max_tokens=64, seed=7)
    # Streaming: tokens are on the page while the request still runs. Seen from inside the page
    # as tokens land (a MutationObserver), since a poll from here may come after a fast stream.
    page.evaluate(f"""() => {{ window.sawRunning = false; new MutationObserver(() => {{
        if ({COUNT} > 0 && document.getElementById('status').dataset.state === 'running')
            window.sawRunning = true;
    }}).observe(document.getElementById('output'), {{childList: true, subtree: true}}); }}""")
    page.click("#generate")
    wait_done(page)
    assert page.evaluate("() => window.sawRunning"), "no token was shown while it ran"
    shown = page.evaluate(TOKENS_JS)

    body = {"model": srv.model, "prompt": PROMPT, "max_tokens": 64, "temperature": 1.0,
            "top_p": 1.0, "seed": 7, "ignore_eos": True, "logprobs": 1,
            "spec_decode_token_origin": True}
    response = httpx.post(srv.base_url + "/completions", json=body, timeout=60).json()
    choice = response["choices"][0]
    assert_same_tokens(shown, api_tokens(choice, chat=False))
    origins = {t["origin"] for t in shown}
    kinds = {t["kind"] for t in shown}
    assert origins == {"draft", "target"} and {"accepted", "recovered"} <= kinds

    # The request's figures are the response's own.
    spec = response["metrics"]["speculative_decoding"]
    assert abs(percent(page.inner_text("#acceptance-rate"))
               - spec["draft_acceptance_rate"]) <= 0.0005 + 1e-9  # shown as 35.9 %
    assert abs(float(page.inner_text("#mean-acceptance-length"))
               - spec["mean_acceptance_length"]) <= 0.005 + 1e-9  # shown as 2.07
    assert float(page.inner_text("#tokens-per-second")) > 0
    assert page.inner_text("#tokens-generated") == "64"
    # By position, from the marks: position i was accepted in the steps that accepted more
    # than i drafts, which the response's histogram counts.
    histogram, steps = spec["acceptance_histogram"], spec["num_spec_steps"]
    shown_rates = [percent(part.split(":")[1])
                   for part in page.inner_text("#acceptance-by-position").split("·")]
    assert len(shown_rates) == 3
    for i, rate in enumerate(shown_rates):
        assert abs(rate - sum(histogram[i + 1:]) / steps) <= 0.0005 + 1e-9, i
    # Server totals from /metrics (it has served at least this request).
    page.wait_for_function("document.getElementById('server-generation-tokens').textContent"
                           " >= 64", timeout=TIMEOUT_MS)
    assert 0 < percent(page.inner_text("#server-acceptance")) < 1
    # Both charts drew this request: three positions, one point per verify step.
    bars = page.evaluate("() => Chart.getChart('chart-position').data.datasets"
                         ".map(d => d.data)")
    assert len(bars) == 2 and all(len(d) == 3 for d in bars) and bars[0][0] > 0
    line = page.evaluate("() => Chart.getChart('chart-time').data.datasets[0].data.length")
    assert line == spec["num_spec_steps"]

    # Hover: a recovered token names the draft's rejected guess, its id and logprob.
    recovered = page.locator("#output [data-kind=recovered]").first
    recovered.hover()
    tip = page.inner_text("#token-tooltip")
    assert "rejected draft" in tip and f"token id {recovered.get_attribute('data-token-id')}" in tip
    assert "logprob" in tip

    path = screenshot_dir / "page-completion.png"
    page.screenshot(path=str(path), full_page=True)
    SCREENSHOTS.append(str(path))
    print(f"page screenshot: {path}")
    assert not page.errors
    assert all(u.startswith(srv.url) for u in page.requests), page.requests


def test_chat_marks_match_the_streamed_api(page: Any, web_servers: WebServers) -> None:
    """Chat mode: the page's marks equal those of the same seeded request streamed through the
    API (chunk by chunk, as the page reads it)."""
    srv = web_servers.spec
    open_page(page, srv)
    fill_request(page, "chat", "Tell me about drafts.", max_tokens=32, seed=11)
    page.click("#generate")
    wait_done(page)
    shown = page.evaluate(TOKENS_JS)

    body = {"model": srv.model, "messages": [{"role": "user", "content": "Tell me about drafts."}],
            "max_tokens": 32, "temperature": 1.0, "top_p": 1.0, "seed": 11, "ignore_eos": True,
            "logprobs": True, "spec_decode_token_origin": True, "stream": True}
    events = parse_sse(httpx.post(srv.base_url + "/chat/completions", json=body,
                                  timeout=60).text)
    expected: list[dict] = []
    for event in events:
        if event == "[DONE]":
            continue
        for choice in event["choices"]:
            if "spec_decode_token_origin" in choice:
                expected += api_tokens(choice, chat=True)
    assert_same_tokens(shown, expected)
    assert len(shown) == 32 and {t["origin"] for t in shown} == {"draft", "target"}


def test_stop_ends_the_stream(page: Any, web_servers: WebServers) -> None:
    """Stop ends the stream in the page and the server stops generating for it."""
    srv = web_servers.spec
    open_page(page, srv)
    fill_request(page, "completion", PROMPT, max_tokens=480, seed=3)
    # Stop is clicked from inside the page as the 10th token lands: from the test process the
    # click could arrive after all 480 tokens (about a second with the fused CPU step), and
    # the page would rightly say "done" instead.
    page.evaluate(f"""() => new MutationObserver((_, observer) => {{
        if ({COUNT} >= 10) {{ observer.disconnect(); document.getElementById('stop').click(); }}
    }}).observe(document.getElementById('output'), {{childList: true, subtree: true}})""")
    page.click("#generate")
    page.wait_for_selector("#status[data-state=stopped]", timeout=TIMEOUT_MS)
    stopped_at = page.evaluate(COUNT_JS)
    assert stopped_at < 480
    assert page.is_enabled("#generate") and not page.is_enabled("#stop")
    # The server aborts the request on the disconnect: nothing stays running.
    deadline = time.monotonic() + 10
    while True:
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        running = re.search(r'^vllm:num_requests_running\{[^}]*\} (\S+)', metrics, re.M)
        if running and float(running.group(1)) == 0:
            break
        assert time.monotonic() < deadline, "the stopped request still runs on the server"
        time.sleep(0.1)
    assert page.evaluate(COUNT_JS) == stopped_at  # and nothing more arrived
    assert not page.errors


def test_no_draft_with_api_key_and_errors(page: Any, web_servers: WebServers) -> None:
    """Without a draft the page says so and marks every token the target's; with --api-key it
    asks for the key on the 401, then works; server errors show in words, also an error event
    inside a stream."""
    srv = web_servers.plain
    page.goto(srv.url + "/")
    page.wait_for_selector("#api-key-panel:not([hidden])", timeout=TIMEOUT_MS)
    assert "Unauthorized" in page.inner_text("#error")
    page.fill("#api-key", API_KEY)
    page.click("#save-key")
    page.wait_for_function(f"document.getElementById('model-name').textContent === "
                           f"{srv.model!r}", timeout=TIMEOUT_MS)
    assert page.is_hidden("#api-key-panel") and page.is_hidden("#error")
    assert page.evaluate("() => localStorage.getItem('tandem.apiKey')") == API_KEY
    page.wait_for_function("document.getElementById('draft-status').textContent"
                           ".includes('no draft model')", timeout=TIMEOUT_MS)

    fill_request(page, "chat", "Hello", max_tokens=12, seed=1)
    page.click("#generate")
    wait_done(page)
    shown = page.evaluate(TOKENS_JS)
    assert len(shown) == 12 and {t["origin"] for t in shown} == {"target"}
    assert page.inner_text("#acceptance-rate") == "n/a"
    assert page.inner_text("#server-acceptance") == "n/a"

    # An error answer (OpenAI's shape) shows its message.
    fill_request(page, "completion", PROMPT, max_tokens=5000, seed=1)
    page.click("#generate")
    page.wait_for_selector("#status[data-state=failed]", timeout=TIMEOUT_MS)
    assert "maximum context length is 512 tokens" in page.inner_text("#error")

    # An error event inside a stream (the server's sse_error) shows its message too.
    failing = 'data: {"choices": []}\n\n' + sse_error(OpenAIError("the engine fell over", 500)).decode()

    def fail_stream(route: Any) -> None:
        route.fulfill(status=200, headers={"content-type": "text/event-stream"},
                      body=failing + "data: [DONE]\n\n")

    page.route("**/v1/completions", fail_stream)
    fill_request(page, "completion", PROMPT, max_tokens=8, seed=1)
    page.click("#generate")
    page.wait_for_selector("#status[data-state=failed]", timeout=TIMEOUT_MS)
    assert "the engine fell over" in page.inner_text("#error")
    assert not page.errors

"""The page shows a thinking model's reasoning apart from its answer (`--reasoning-parser`,
issue 25): in headless Chromium against a real `tandem serve` on a tiny model that writes
`</think>` after a few tokens, the tokens in the reasoning box and in the answer box are the API's
tokens of the same greedy request, cut where its `reasoning_content` ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from entrypoints.server_helpers import ServerProcess
from tiny_models import THINK_MESSAGES
from web.browser_helpers import SCREENSHOTS
from web.test_page import fill_request, open_page, wait_done

PROMPT = THINK_MESSAGES[0]["content"]
TEXTS_JS = """(box) => [...document.querySelectorAll('#' + box + ' [data-origin]')]
    .map(e => e.textContent)"""


def test_reasoning_shows_apart_from_the_answer(browser: Any, think_r1_server: ServerProcess,
                                               screenshot_dir: Path) -> None:
    srv = think_r1_server  # (after `browser`: a machine without one skips before the server)
    context = browser.new_context(viewport={"width": 1300, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        open_page(page, srv)
        assert page.is_hidden("#reasoning-box")  # nothing to show before a request
        fill_request(page, "chat", PROMPT, max_tokens=16, seed=1, temperature=0.0)
        page.click("#generate")
        wait_done(page)
        reasoning = page.evaluate(TEXTS_JS, "reasoning")
        answer = page.evaluate(TEXTS_JS, "output")
        assert page.is_visible("#reasoning-box")
        path = str(screenshot_dir / "page-reasoning.png")
        page.screenshot(path=path)
        SCREENSHOTS.append(path)
    finally:
        context.close()
    body = {"model": srv.model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 16, "temperature": 0.0, "ignore_eos": True, "logprobs": True}
    choice = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60).json()[
        "choices"][0]
    message, tokens = choice["message"], [t["token"] for t in choice["logprobs"]["content"]]
    assert message["reasoning_content"] and message["content"], message
    # the same tokens, cut after </think>: the tag stays with the reasoning, out of the answer
    assert reasoning + answer == tokens
    assert reasoning[-1] == "</think>" and "".join(reasoning[:-1]) == message["reasoning_content"]
    assert "".join(answer).startswith(message["content"])  # (token texts show partial UTF-8)
    assert not errors

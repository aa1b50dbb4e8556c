"""Models, health, version, metrics and the tokenizer endpoints lm-evaluation-harness probes
(checklist items 49-52), plus API keys and a model without a chat template."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from entrypoints.server_helpers import API_KEY, ServerProcess, client_for


def test_models(client: openai.OpenAI, server: ServerProcess) -> None:
    models = client.models.list()                                              # 49
    assert [m.id for m in models.data] == ["tiny"] and models.object == "list"
    assert client.models.retrieve("tiny").id == "tiny"                       # 50
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("missing")
    card = httpx.get(server.base_url + "/models").json()["data"][0]
    assert card["max_model_len"] == 256 and card["object"] == "model"


def test_health_version_metrics(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/health").status_code == 200               # 51
    assert isinstance(httpx.get(server.url + "/version").json()["version"], str)  # 52
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "tandem:kv_cache_free_blocks{" in r.text and "tandem:http_requests_total{" in r.text
    type_lines = [line for line in r.text.splitlines() if line.startswith("# TYPE")]
    assert len(type_lines) == len(set(type_lines))


def test_tokenizer_endpoints(server: ServerProcess, tokenizer: Any) -> None:
    r = httpx.post(server.url + "/tokenize", json={"prompt": "test", "add_special_tokens": False})
    tokens = r.json()["tokens"]
    assert tokens == tokenizer("test", add_special_tokens=False).input_ids
    assert r.json()["count"] == len(tokens) and r.json()["max_model_len"] == 256
    assert httpx.post(server.url + "/detokenize", json={"tokens": tokens}).json() == \
        {"prompt": "test"}
    r = httpx.post(server.url + "/tokenize", json={
        "messages": [{"role": "user", "content": "hi"}], "return_token_strs": True})
    assert len(r.json()["token_strs"]) == r.json()["count"]
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] == tokenizer.eos_token and info["chat_template"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": [10**7]}).status_code == 400


def test_api_key_required(secured_base_server: ServerProcess) -> None:
    srv = secured_base_server
    with pytest.raises(openai.AuthenticationError):
        client_for(srv, api_key="wrong").models.list()
    r = httpx.post(srv.base_url + "/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/metrics").status_code == 200
    good = client_for(srv, api_key=API_KEY)
    assert [m.id for m in good.models.list().data] == ["base"]
    r = good.completions.create(model="base", prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_chat_without_template_says_pass_chat_template(secured_base_server: ServerProcess
                                                       ) -> None:
    client = client_for(secured_base_server, api_key=API_KEY)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="base", max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    assert "--chat-template" in info.value.message
    # Completions still work on a base model, and the server keeps serving.
    r = client.completions.create(model="base", prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_request_chat_template_on_a_base_model(secured_base_server: ServerProcess) -> None:
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    r = httpx.post(secured_base_server.base_url + "/chat/completions",
                   headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": "base", "max_tokens": 2, "chat_template": template,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2

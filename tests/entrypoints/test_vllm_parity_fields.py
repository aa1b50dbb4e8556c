"""vLLM parity of request fields (issue 11), over a real socket with the openai client:
prompt_logprobs, return_tokens_as_token_ids, truncate_prompt_tokens, every spelling of structured
outputs (exact with a same-vocabulary draft and a TLI draft, greedy outputs identical to the
plain server's), tool calling in OpenAI's shape, unknown fields refused, OpenAI's no-op fields
accepted, and min_tokens with stop strings. The hermes tool parser is tested on crafted text
(a tiny random model never writes <tool_call> of its own accord)."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Optional

import openai
import pytest

from entrypoints.server_helpers import ServerProcess, client_for
from tandem.entrypoints.chat_utils import apply_chat_template
from tandem.entrypoints.openai.tool_choice import AUTO_NEEDS_FLAGS
from tandem.entrypoints.openai.tool_parsers import HermesToolParser

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Answer in JSON, please."}]
CHOICES = ["yes", "no", "maybe"]
REGEX = r"[a-z]{3,6} [0-9]{2}"
# a JSON schema whose every value is bounded, so even a random model finishes it; without free
# whitespace (llguidance's x-guidance option for spellings that cannot say so otherwise), since
# a random model would otherwise write whitespace until max_tokens
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "b", "c"],
          "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                         "b": {"type": "string", "maxLength": 5},
                         "c": {"enum": ["red", "green"]}}}
COMPACT_SCHEMA = {**SCHEMA, "x-guidance": {"whitespace_flexible": False}}
LARK = 'start: "x" /[0-9]{1,3}/ "y"'
GBNF = 'root ::= ("ab" | "cd") [0-9] [0-9]?'


def _matches_schema(text: str) -> None:
    value = json.loads(text)
    assert isinstance(value, dict) and set(value) == {"a", "b", "c"}, value
    assert type(value["a"]) is int and 0 <= value["a"] <= 99, value
    assert isinstance(value["b"], str) and len(value["b"]) <= 5, value
    assert value["c"] in ("red", "green"), value


def _fullmatch(pattern: str) -> Callable[[str], None]:
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), (pattern, text)
    return check


def _is_object(text: str) -> None:
    assert isinstance(json.loads(text), dict), text


def _in_choices(text: str) -> None:
    assert text in CHOICES, text


KINDS: dict[str, tuple[dict[str, Any], Callable[[str], None]]] = {
    "structured_outputs.choice": ({"structured_outputs": {"choice": CHOICES}}, _in_choices),
    "structured_outputs.regex": ({"structured_outputs": {"regex": REGEX}}, _fullmatch(REGEX)),
    "structured_outputs.json": ({"structured_outputs": {"json": SCHEMA,
                                                        "disable_any_whitespace": True}},
                                _matches_schema),
    "structured_outputs.grammar(lark)": ({"structured_outputs": {"grammar": LARK}},
                                         _fullmatch(r"x[0-9]{1,3}y")),
    "structured_outputs.grammar(gbnf)": ({"structured_outputs": {"grammar": GBNF}},
                                         _fullmatch(r"(ab|cd)[0-9][0-9]?")),
    "guided_choice": ({"guided_choice": CHOICES}, _in_choices),
    "guided_regex": ({"guided_regex": REGEX}, _fullmatch(REGEX)),
    "guided_json": ({"guided_json": json.dumps(COMPACT_SCHEMA)}, _matches_schema),
    "guided_grammar": ({"guided_grammar": GBNF}, _fullmatch(r"(ab|cd)[0-9][0-9]?")),
    "response_format.json_object": ({"response_format": {"type": "json_object"}}, _is_object),
    "response_format.json_schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": COMPACT_SCHEMA}}}, _matches_schema),
}


@pytest.fixture(scope="module")
def servers(server: ServerProcess, spec_server: ServerProcess, tli_server: ServerProcess
            ) -> dict[str, tuple[ServerProcess, openai.OpenAI]]:
    """Without a draft, with a same-vocabulary draft, with a draft of another tokenizer."""
    return {name: (srv, client_for(srv)) for name, srv in
            (("plain", server), ("spec", spec_server), ("tli", tli_server))}


def _drafted(response: Any) -> int:
    spec = response.model_extra["metrics"]["speculative_decoding"]
    return spec["num_draft_tokens"] if spec else 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_structured_output_matches_with_and_without_a_draft(kind: str, servers: dict) -> None:
    body, check = KINDS[kind]
    outputs = {}
    for name, (srv, oa) in servers.items():
        comp = oa.completions.create(model=srv.model, prompt=PROMPT, max_tokens=40,
                                     temperature=0, extra_body=body)
        chat = oa.chat.completions.create(model=srv.model, messages=MESSAGES, max_tokens=40,
                                          temperature=0, extra_body=body)
        texts = (comp.choices[0].text, chat.choices[0].message.content)
        for text in texts:
            check(text)
        assert comp.choices[0].finish_reason == chat.choices[0].finish_reason == "stop", texts
        if name != "plain" and comp.usage.completion_tokens > 2:
            assert _drafted(comp) > 0  # the draft ran, masked by the same grammar
        outputs[name] = texts
    assert outputs["spec"] == outputs["plain"] and outputs["tli"] == outputs["plain"], outputs


def test_structured_output_streams_the_same_text(servers: dict) -> None:
    body, check = KINDS["structured_outputs.json"]
    srv, oa = servers["tli"]
    whole = oa.completions.create(model=srv.model, prompt=PROMPT, max_tokens=40, temperature=0,
                                  extra_body=body).choices[0].text
    chunks = list(oa.completions.create(model=srv.model, prompt=PROMPT, max_tokens=40,
                                        temperature=0, stream=True, extra_body=body))
    assert "".join(c.choices[0].text for c in chunks) == whole
    srv, oa = servers["spec"]
    chunks = list(oa.chat.completions.create(model=srv.model, messages=MESSAGES, max_tokens=40,
                                             temperature=0, stream=True, extra_body=body))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_structured_output_errors_are_400(client: openai.OpenAI, server: ServerProcess) -> None:
    for body, words in (
            ({"guided_regex": "a", "guided_choice": ["b"]}, "Only one kind of structured output"),
            ({"structured_outputs": {"choice": []}}, "non-empty list"),
            ({"structured_outputs": {"bogus": 1}}, "Unknown structured_outputs field"),
            ({"guided_json": "{not json"}, "not valid JSON"),
            ({"guided_grammar": "root ::= ("}, "GBNF"),
            ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
            ({"guided_decoding_backend": "xgrammar", "guided_regex": "a"}, "llguidance")):
        with pytest.raises(openai.BadRequestError, match=re.escape(words)):
            client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4,
                                      extra_body=body)


# ---- tool calling -------------------------------------------------------------------------

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["tz"],
        "properties": {"tz": {"enum": ["UTC", "CET"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
# named: the tool's own schema is the grammar's, so it can ask for compact JSON
NAMED_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    **WEATHER, "x-guidance": {"whitespace_flexible": False}}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _check_call(call: Any) -> None:
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "days"} and args["city"] in ("Paris", "Tokyo"), args
        assert type(args["days"]) is int and 1 <= args["days"] <= 7, args
    else:
        assert call.function.name == "get_time" and args in ({"tz": "UTC"}, {"tz": "CET"}), args


def test_named_tool_choice_returns_the_call(servers: dict) -> None:
    arguments = {}
    for name, (srv, oa) in servers.items():
        r = oa.chat.completions.create(model=srv.model, messages=MESSAGES, tools=NAMED_TOOLS,
                                       tool_choice=NAMED, max_tokens=40, temperature=0)
        message = r.choices[0].message
        assert message.content is None and len(message.tool_calls) == 1
        assert message.tool_calls[0].function.name == "get_weather"
        _check_call(message.tool_calls[0])
        assert r.choices[0].finish_reason == "stop"  # vLLM keeps a named call's own reason
        arguments[name] = message.tool_calls[0].function.arguments
    assert len(set(arguments.values())) == 1, arguments  # greedy: the draft changes nothing
    srv, oa = servers["spec"]
    with oa.chat.completions.stream(model=srv.model, messages=MESSAGES, tools=NAMED_TOOLS,
                                    tool_choice=NAMED, max_tokens=40, temperature=0) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [("get_weather", arguments["plain"])]


def test_required_tool_choice_returns_calls_matching_their_schemas(servers: dict) -> None:
    """Seeded sampling: greedy decoding of a random model writes whitespace between JSON tokens
    until max_tokens (JSON allows it); samples finish the array within 200 tokens. (Whether one
    does depends on the seed: seed 5's first choice does under Gumbel-max sampling, which seeded
    requests get under the default "auto" method, with a draft and without alike.)"""
    kwargs = dict(messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200,
                  temperature=1.0, seed=5, n=3)
    for name in ("plain", "spec"):
        srv, oa = servers[name]
        r = oa.chat.completions.create(model=srv.model, **kwargs)
        finished = [c for c in r.choices if c.finish_reason == "tool_calls"]
        assert finished, [(c.finish_reason, c.message.content) for c in r.choices]
        for choice in r.choices:
            if choice.finish_reason == "tool_calls":
                assert choice.message.content is None and choice.message.tool_calls
                for call in choice.message.tool_calls:
                    _check_call(call)
            else:  # cut off by max_tokens: the partial JSON is returned as content
                assert choice.finish_reason == "length" and choice.message.tool_calls == []
    srv, oa = servers["plain"]
    whole = oa.chat.completions.create(model=srv.model, **{**kwargs, "n": 1}).choices[0]
    with oa.chat.completions.stream(model=srv.model, **{**kwargs, "n": 1}) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_tool_choice_errors_are_vllms(client: openai.OpenAI, server: ServerProcess) -> None:
    def error(**kwargs: Any) -> str:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=4,
                                           **kwargs)
        return info.value.response.json()["error"]["message"]

    assert AUTO_NEEDS_FLAGS == ('"auto" tool choice requires --enable-auto-tool-choice and '
                                '--tool-call-parser to be set')
    assert error(tools=TOOLS, tool_choice="auto") == AUTO_NEEDS_FLAGS
    assert error(tools=TOOLS) == AUTO_NEEDS_FLAGS  # tools without tool_choice mean "auto"
    assert error(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}) \
        == "Tool 'nope' has not been passed in `tools`."
    assert error(tool_choice="required") == "When using `tool_choice`, `tools` must be set."
    assert "cannot be combined" in error(tools=TOOLS, tool_choice="required",
                                         extra_body={"guided_regex": "a"})
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS,
                                       tool_choice="none", max_tokens=3, temperature=0)
    assert isinstance(r.choices[0].message.content, str) and not r.choices[0].message.tool_calls


HERMES_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"Paris", "days": 2}}\n</tool_call>\n<tool_call>{"name": "get_time", '
               '"parameters": {"tz": "UTC"}}</tool_call>')
HERMES_CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "UTC"})]


def _calls(calls: list[dict]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_parser_whole_output() -> None:
    parsed = HermesToolParser().extract(HERMES_TEXT)
    assert parsed.content == "Let me check."
    assert _calls(parsed.tool_calls) == HERMES_CALLS
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-")
               for c in parsed.tool_calls)
    assert HermesToolParser().extract("no calls < here").content == "no calls < here"
    broken = 'x <tool_call>{"name": oops}</tool_call>'
    assert HermesToolParser().extract(broken).content == broken  # bad JSON stays content
    unclosed = HermesToolParser().extract('<tool_call>{"name": "get_time", "arguments": {}}')
    assert unclosed.content is None and _calls(unclosed.tool_calls) == [("get_time", {})]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 10_000])
def test_hermes_parser_streamed_in_odd_chunks(size: int) -> None:
    text = HERMES_TEXT + " Done <tool"  # ends in what could start a tag
    parser, content, calls = HermesToolParser(), "", []
    for i in range(0, len(text), size):
        delta = parser.feed(text[i:i + size])
        assert "<tool_call>" not in delta.get("content", "")
        content += delta.get("content", "")
        calls += delta.get("tool_calls", [])
    rest = parser.finish()
    content += rest.get("content", "")
    calls += rest.get("tool_calls", [])
    assert content == "Let me check.\n\n Done <tool"
    assert _calls(calls) == HERMES_CALLS and [c["index"] for c in calls] == [0, 1]
    assert parser.called


# ---- other request fields -----------------------------------------------------------------

def _decode(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids` as a finished output holds it: a last character whose UTF-8 bytes are
    incomplete is never emitted (as in vLLM)."""
    return tokenizer.decode(ids).rstrip("\ufffd")


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


def _check_prompt_logprobs(entries: list, ids: list[int], k: int) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    for entry, token_id in zip(entries[1:], ids[1:]):
        assert str(token_id) in entry and k <= len(entry) <= k + 1  # the prompt's own token too
        for value in entry.values():
            assert value["logprob"] <= 0 and isinstance(value["decoded_token"], str)


def test_prompt_logprobs_and_truncation(client: openai.OpenAI, server: ServerProcess,
                                        tokenizer: Any) -> None:
    ids = _prompt_ids(tokenizer, PROMPT)
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=2,
                                  extra_body={"prompt_logprobs": 2})
    _check_prompt_logprobs(r.choices[0].model_extra["prompt_logprobs"], ids, 2)
    prompt = apply_chat_template(tokenizer, MESSAGES)
    chat_ids = list(tokenizer(prompt, add_special_tokens=False).input_ids)
    r = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=2,
                                       extra_body={"prompt_logprobs": 1})
    _check_prompt_logprobs(r.model_extra["prompt_logprobs"], chat_ids, 1)
    with pytest.raises(openai.BadRequestError, match="not available when `stream=True`"):
        client.completions.create(model=server.model, prompt=PROMPT, max_tokens=2, stream=True,
                                  extra_body={"prompt_logprobs": 1})
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=2,
                                  extra_body={"prompt_logprobs": 0, "truncate_prompt_tokens": 3})
    assert r.usage.prompt_tokens == 3
    _check_prompt_logprobs(r.choices[0].model_extra["prompt_logprobs"], ids[-3:], 0)


def test_return_tokens_as_token_ids_per_request(client: openai.OpenAI, server: ServerProcess,
                                                tokenizer: Any) -> None:
    as_id = re.compile(r"token_id:(\d+)")
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, logprobs=2,
                                  temperature=0, extra_body={"return_tokens_as_token_ids": True,
                                                             "prompt_logprobs": 1})
    choice = r.choices[0]
    ids = [int(as_id.fullmatch(t).group(1)) for t in choice.logprobs.tokens]
    assert _decode(tokenizer, ids) == choice.text
    assert all(as_id.fullmatch(k) for top in choice.logprobs.top_logprobs for k in top)
    assert all(as_id.fullmatch(v["decoded_token"]) for e in choice.model_extra["prompt_logprobs"]
               if e for v in e.values())
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6,
                                      logprobs=2, temperature=0).choices[0]
    assert "".join(plain.logprobs.tokens) == plain.text and plain.text == choice.text
    chat = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=4,
                                          logprobs=True, top_logprobs=2, temperature=0,
                                          extra_body={"return_tokens_as_token_ids": True})
    content = chat.choices[0].logprobs.content
    ids = [int(as_id.fullmatch(c.token).group(1)) for c in content]
    assert _decode(tokenizer, ids) == chat.choices[0].message.content
    assert all(bytes(c.bytes) == c.token.encode() for c in content)
    assert all(as_id.fullmatch(t.token) for c in content for t in c.top_logprobs)


def test_unknown_fields_are_400_naming_them_and_openai_no_ops_succeed(
        client: openai.OpenAI, server: ServerProcess) -> None:
    for call in (lambda **kw: client.completions.create(prompt=PROMPT, **kw),
                 lambda **kw: client.chat.completions.create(messages=MESSAGES, **kw)):
        with pytest.raises(openai.BadRequestError) as info:
            call(model=server.model, max_tokens=2, extra_body={"foo_bar": 1})
        error = info.value.response.json()["error"]
        assert error["param"] == "foo_bar" and "'foo_bar'" in error["message"]
        with pytest.raises(openai.BadRequestError, match="length_penalty"):
            call(model=server.model, max_tokens=2, extra_body={"length_penalty": 1.0})
        r = call(model=server.model, max_tokens=2,
                 extra_body={"store": True, "metadata": {"k": "v"}, "service_tier": "auto"})
        assert r.usage.completion_tokens == 2
    deadline = time.monotonic() + 5
    while "request field 'store' has no effect" not in server.log():
        assert time.monotonic() < deadline, "the ignored OpenAI field was not logged"
        time.sleep(0.1)


def _greedy(client: openai.OpenAI, model: str, stop: Optional[list[str]] = None,
            min_tokens: int = 0, stream: bool = False) -> tuple[str, list[int], Optional[str]]:
    kwargs = dict(model=model, prompt="Hello, my name is", max_tokens=16, temperature=0,
                  logprobs=0, stop=stop, extra_body={"min_tokens": min_tokens,
                                                     "return_tokens_as_token_ids": True})
    if stream:
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **kwargs)]
        return ("".join(c.text for c in chunks),
                [int(t[9:]) for c in chunks if c.logprobs for t in c.logprobs.tokens],
                chunks[-1].finish_reason)
    choice = client.completions.create(**kwargs).choices[0]
    return choice.text, [int(t[9:]) for t in choice.logprobs.tokens], choice.finish_reason


def test_min_tokens_with_a_stop_string_keeps_the_text_whole(
        client: openai.OpenAI, server: ServerProcess, tokenizer: Any) -> None:
    text, ids, _ = _greedy(client, server.model)
    assert _decode(tokenizer, ids) == text and len(ids) == 16
    stop = next(text[i:i + 2] for i in range(2, len(text) // 2) if text[i:i + 2].isalpha())
    cut, _, reason = _greedy(client, server.model, stop=[stop])
    assert reason == "stop" and cut == text[:text.index(stop)]  # the stop string does occur
    for stream in (False, True):
        whole, ids, reason = _greedy(client, server.model, stop=[stop], min_tokens=16,
                                     stream=stream)
        assert len(ids) == 16 and reason == "length"
        assert whole == _decode(tokenizer, ids) == text, (stop, whole)

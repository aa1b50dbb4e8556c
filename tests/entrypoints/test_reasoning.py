"""Reasoning output (`--reasoning-parser qwen3 | deepseek_r1`, issue 25): the parsers on crafted
text, the grammar gate of structured outputs on a real llguidance grammar (drafts crossing
`</think>` included), and over a real socket with the openai client a tiny model whose tokenizer
has `<think>`/`</think>` and whose chat template opens the think block (Qwen3-Thinking-2507 and
DeepSeek-R1 style), relabelled so that its greedy answer closes the reasoning after a few tokens.
The server's split is checked against the raw text of the same request through /v1/completions
(no parser there), whole and streamed, with and without a draft."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest
import torch

from entrypoints.server_helpers import ServerProcess, client_for, start_server, stop_server
from tandem.entrypoints.openai.reasoning_parsers import (CONTENT, OPEN, REASONING,
                                                         DeepSeekR1ReasoningParser,
                                                         Qwen3ReasoningParser,
                                                         make_reasoning_parser)
from tandem.sample.reasoning_gate import ReasoningGrammar, ThinkTags
from tiny_models import THINK_MESSAGES as MESSAGES

# bounded values and no free whitespace or strings, so a random model finishes it
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "c"],
          "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                         "c": {"enum": ["red", "green"]}},
          "x-guidance": {"whitespace_flexible": False}}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


class _Vocab:
    def __init__(self, special: bool = False) -> None:
        self.all_special_tokens = ["<think>", "</think>"] if special else []

    def get_vocab(self) -> dict[str, int]:
        return {"<think>": 1, "</think>": 2}


# ---- the parsers on crafted text ------------------------------------------------------------

SPLITS = [  # (parser, phase, output) -> (reasoning, content) of the whole output
    ("deepseek_r1", REASONING, "abc</think>xyz", ("abc", "xyz")),
    ("deepseek_r1", REASONING, "<think>abc</think>xyz", ("abc", "xyz")),
    ("deepseek_r1", REASONING, "abc", ("abc", None)),          # cut inside the reasoning
    ("deepseek_r1", REASONING, "abc</think>", ("abc", None)),
    ("qwen3", REASONING, "abc</think>xyz", ("abc", "xyz")),    # the prompt opened <think>
    ("qwen3", OPEN, "<think>abc</think>xyz", ("abc", "xyz")),
    ("qwen3", OPEN, "abc</think>xyz", (None, "abc</think>xyz")),  # both tags needed
    ("qwen3", OPEN, "just an answer", (None, "just an answer")),
    ("qwen3", CONTENT, "<think>abc</think>xyz", (None, "<think>abc</think>xyz")),
    ("deepseek_r1", CONTENT, "abc</think>xyz", (None, "abc</think>xyz")),  # prompt closed it
]


@pytest.mark.parametrize("name,phase,text,expected", SPLITS)
def test_whole_and_streamed_splits(name: str, phase: str, text: str, expected: tuple) -> None:
    parser = make_reasoning_parser(name, _Vocab())
    assert parser.extract(text, phase) == expected
    for size in (1, 3, len(text)):  # tags split across deltas are held back, never sent
        stream, reasoning, content = parser.stream(phase), "", ""
        for i in range(0, len(text), size):
            r, c = stream.feed(text[i:i + size])
            reasoning, content = reasoning + r, content + c
        r, c = stream.finish()
        assert (reasoning + r or None, content + c or None) == expected, size


def test_start_phase_reads_the_last_think_tag_of_the_prompt() -> None:
    qwen3, r1 = Qwen3ReasoningParser(_Vocab()), DeepSeekR1ReasoningParser(_Vocab())
    for parser in (qwen3, r1):
        assert parser.start_phase([5, 1, 6]) == REASONING          # "<think>\n"
        assert parser.start_phase([1, 6, 2, 6]) == CONTENT         # enable_thinking false
        assert parser.start_phase([1, 7, 2, 5, 1]) == REASONING    # an earlier turn, then open
        assert parser.think_tags(CONTENT) is None
    assert qwen3.start_phase([5, 6]) == OPEN and r1.start_phase([5, 6]) == REASONING
    assert qwen3.think_tags(OPEN) == ThinkTags(1, 2, in_reasoning=False)
    # vLLM's streaming: a qwen3 output cut inside its think block was sent as reasoning
    stream = qwen3.stream(OPEN)
    assert stream.feed("<think>ab") == ("ab", "") and stream.finish() == ("", "")
    assert Qwen3ReasoningParser(_Vocab(special=True)).tags_are_special


def test_a_tokenizer_without_think_tags_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="--reasoning-parser qwen3: the tokenizer has no "
                                         "<think> and </think> tokens"):
        make_reasoning_parser("qwen3", tokenizer)


# ---- a model that thinks -------------------------------------------------------------------

@pytest.fixture(scope="module")
def r1_server(think_r1_server: ServerProcess) -> ServerProcess:
    return think_r1_server


@pytest.fixture(scope="module")
def qwen3_spec_server(think_model: Path, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[ServerProcess]:
    """qwen3, with the same model as a draft of 3 tokens: the grammar masks of verify steps
    whose drafts cross </think>."""
    spec = json.dumps({"model": str(think_model), "num_speculative_tokens": 3, "adaptive": False})
    srv = start_server(str(think_model), ["--served-model-name", "think-qwen3",
                                             "--reasoning-parser", "qwen3",
                                             "--speculative-config", spec],
                       tmp_path_factory.mktemp("logs") / "qwen3_server.log")
    yield srv
    stop_server(srv.proc)


def _chat(oa: openai.OpenAI, srv: ServerProcess, stream: bool, **extra: Any) -> tuple:
    """(reasoning, content, finish_reason) of a greedy chat request, whole or streamed."""
    kw = dict(model=srv.model, messages=MESSAGES, temperature=0, max_tokens=40, **extra)
    if not stream:
        message = (choice := oa.chat.completions.create(**kw).choices[0]).message
        extra_fields = message.model_extra
        assert extra_fields["reasoning"] == extra_fields["reasoning_content"]
        return extra_fields["reasoning_content"], message.content, choice.finish_reason
    reasoning, content, finish = "", "", None
    for chunk in oa.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        fields = delta.model_extra or {}
        assert fields.get("reasoning") == fields.get("reasoning_content")
        reasoning += fields.get("reasoning_content") or ""
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    return reasoning or None, content or None, finish


def _raw(oa: openai.OpenAI, srv: ServerProcess, enable_thinking: bool = True) -> str:
    """The same request's text with no parser: the prompt rendered here, through completions."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(srv.model_dir)
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True,
                                     enable_thinking=enable_thinking)
    ids = tok.encode(prompt, add_special_tokens=False)
    return oa.completions.create(model=srv.model, prompt=ids, temperature=0,
                                 max_tokens=40).choices[0].text


@pytest.mark.parametrize("which", ["r1", "qwen3_spec"])
def test_reasoning_and_content_split_whole_and_streamed(which: str, request: Any,
                                                        think_model: Path) -> None:
    srv = request.getfixturevalue(f"{which}_server")
    oa = client_for(srv)
    raw = _raw(oa, srv)
    reasoning, _, content = raw.partition("</think>")
    assert reasoning and "</think>" in raw, raw  # the fixture's model closes it early
    whole = _chat(oa, srv, stream=False)
    assert whole[:2] == (reasoning, content or None)
    assert _chat(oa, srv, stream=True) == whole
    # include_reasoning false leaves the reasoning out, and the answer as it was
    hidden = oa.chat.completions.create(model=srv.model, messages=MESSAGES, temperature=0,
                                        max_tokens=40, extra_body={"include_reasoning": False})
    assert hidden.choices[0].message.model_extra["reasoning_content"] is None
    assert hidden.choices[0].message.content == whole[1]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_applies_after_the_reasoning(stream: bool, r1_server: ServerProcess,
                                                 qwen3_spec_server: ServerProcess,
                                                 think_model: Path) -> None:
    results = []
    for srv in (r1_server, qwen3_spec_server):
        oa = client_for(srv)
        reasoning, content, finish = _chat(oa, srv, stream,
                                           response_format=RESPONSE_FORMAT)
        # the reasoning is the model's own (unconstrained: the same as without a schema)...
        assert reasoning == _raw(oa, srv).partition("</think>")[0]
        # ...and the answer after it follows the schema
        value = json.loads(content)
        assert set(value) == {"a", "c"} and value["c"] in ("red", "green"), content
        assert finish == "stop"
        results.append((reasoning, content))
    assert results[0] == results[1]  # greedy: with and without drafts alike


def test_enable_thinking_false_passes_through_and_all_is_content(
        qwen3_spec_server: ServerProcess, think_model: Path) -> None:
    srv = qwen3_spec_server
    oa = client_for(srv)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    raw = _raw(oa, srv, enable_thinking=False)
    for stream in (False, True):
        assert _chat(oa, srv, stream, extra_body=off)[:2] == (None, raw)
    # the prompt closed the reasoning, so the schema holds from the first token
    _, content, _ = _chat(oa, srv, False, extra_body=off, response_format=RESPONSE_FORMAT)
    assert set(json.loads(content)) == {"a", "c"}, content


# ---- the grammar gate -----------------------------------------------------------------------

def test_grammar_gate_masks_across_the_end_of_thinking(think_model: Path) -> None:
    from transformers import AutoTokenizer

    from tandem.sample.grammar import GrammarCompiler, GrammarMatcher
    from tandem.sample.structured_params import StructuredOutputsParams

    tok = AutoTokenizer.from_pretrained(str(think_model))
    start, end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    compiler = GrammarCompiler(tok, len(tok))
    proto = compiler.prototype(StructuredOutputsParams(json=SCHEMA))
    plain = GrammarMatcher(proto, len(tok))
    first = plain.allowed()                        # what the schema allows first: "{"
    brace = tok.convert_tokens_to_ids("{")
    assert first[brace] and not first[end] and first.sum() < len(tok)

    gate = ReasoningGrammar(GrammarMatcher(proto, len(tok)), ThinkTags(start, end, True))
    word = tok.encode(" sky", add_special_tokens=False)[0]
    rows = gate.masks([word, end, brace])          # [4, V]
    assert rows[0].all() and rows[1].all()         # reasoning: anything goes
    assert torch.equal(rows[2], first)             # after </think>: the schema's first mask
    assert not rows[3][brace]                      # and it moved on past "{"
    assert gate.phase == REASONING and rows[0].all()  # masks() rolled everything back
    assert gate.try_consume(end) and gate.try_consume(brace)
    assert not gate.try_consume(end)               # the schema refuses </think> in the answer
    gate.rollback(2)
    assert gate.phase == REASONING and gate.allowed().all()
    for t in (word, end, brace):                   # verified tokens
        gate.consume(t)
    assert gate.phase == "grammar" and not gate.finished

    opened = ReasoningGrammar(GrammarMatcher(proto, len(tok)), ThinkTags(start, end, False))
    mask = opened.allowed()                        # qwen3: <think> or the schema's first token
    assert mask[start] and torch.equal(mask.clone().index_fill_(0, torch.tensor([start]), False),
                                       first)
    opened.consume(brace)                          # no <think>: the schema from the first token
    assert opened.phase == "grammar" and not opened.allowed()[start]


# ---- tool calls come from the answer only ---------------------------------------------------

def test_tool_parser_sees_only_the_answer() -> None:
    """A <tool_call> the model writes while it reasons is reasoning text, not a call; the one in
    the answer is parsed (whole and streamed alike)."""
    from types import SimpleNamespace

    from tandem.entrypoints.openai.protocol import ChatCompletionRequest
    from tandem.entrypoints.openai.serving_chat import _ChatAssembler
    from tandem.entrypoints.openai.tool_choice import plan_tools
    from tandem.outputs import CompletionOutput

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=tools)
    serving = SimpleNamespace(options=SimpleNamespace(response_role="assistant"),
                              reasoning=make_reasoning_parser("deepseek_r1", _Vocab()))
    thought = 'maybe <tool_call>{"name": "f", "arguments": {"x": 0}}</tool_call>?'
    text = thought + '</think>ok <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    plan = plan_tools(tools, "auto", True, "hermes")

    def assembler() -> _ChatAssembler:
        return _ChatAssembler(serving, request, "m", "id", 1, plan, REASONING)

    choice = assembler()._full_choice(CompletionOutput(0, text, [], None, None, "stop"))
    message = choice["message"]
    assert message["reasoning_content"] == message["reasoning"] == thought
    assert message["content"] == "ok"
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"x": 1}']
    assert choice["finish_reason"] == "tool_calls"
    streamed, deltas = assembler(), []
    for i in range(0, len(text), 5):
        deltas.append(streamed._delta(0, text[i:i + 5], i + 5 >= len(text)))
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
    assert "".join(d.get("content", "") for d in deltas) == "ok "
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["function"]["arguments"] for c in calls] == ['{"x": 1}']


def test_grammar_after_reasoning_with_a_tli_draft(think_model: Path,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Offline, a draft with another tokenizer (TLI): greedy tokens equal the plain engine's, the
    reasoning is the unconstrained model's and the answer follows the schema."""
    from transformers import AutoTokenizer

    from tandem import LLM, SamplingParams
    from tiny_models import build_tli_draft

    tok = AutoTokenizer.from_pretrained(str(think_model))
    ids = tok.encode(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)
    start, end = tok.convert_tokens_to_ids(["<think>", "</think>"])

    def run(llm: LLM, schema: bool) -> list[int]:
        params = SamplingParams(temperature=0, max_tokens=40,
                                structured_outputs={"json": SCHEMA} if schema else None)
        params._think_tags = ThinkTags(start, end, in_reasoning=True)  # as the server sets it
        return llm.generate([{"prompt_token_ids": ids}], params,
                            use_tqdm=False)[0].outputs[0].token_ids

    plain = LLM(str(think_model))
    free, constrained = run(plain, False), run(plain, True)
    cut = free.index(end) + 1
    assert constrained[:cut] == free[:cut]          # the reasoning: no grammar
    assert set(json.loads(tok.decode(constrained[cut:]))) == {"a", "c"}
    draft = build_tli_draft(think_model, tmp_path_factory.mktemp("think-tli"), noise=0.3)
    tli = LLM(str(think_model), speculative_config={
        "model": str(draft), "num_speculative_tokens": 3, "adaptive": False,
        "method": "draft_model",
        "use_heterogeneous_vocab": True})
    assert run(tli, True) == constrained
    drafted = next(m.value for m in tli.get_metrics()
                   if m.name == "tandem:spec_decode_num_draft_tokens")
    assert drafted > 0

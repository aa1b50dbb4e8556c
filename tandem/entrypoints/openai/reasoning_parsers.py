"""Reasoning parsers (vLLM's `--reasoning-parser NAME`): a thinking model's output split into
`reasoning_content` (the text between `<think>` and `</think>`) and `content` (the answer).

Both parsers read `<think>...</think>` and need both tags as tokens of the vocabulary (vLLM's
check). Where the reasoning stands when the output begins is read off the prompt, the way vLLM's
`is_reasoning_end` scans it (the last think tag of the prompt decides):
- the prompt closed a think block (Qwen3's template with `enable_thinking: false` writes
  `<think>\\n\\n</think>\\n\\n`): the whole output is content, for both parsers;
- the prompt opened one (DeepSeek-R1's and Qwen3-Thinking-2507's templates end in `<think>\\n`):
  the output is reasoning up to `</think>`, for both parsers;
- otherwise `deepseek_r1` still takes the text before `</think>` as reasoning (the model may
  write `<think>` itself, or not), while `qwen3` needs both tags in the output: without them it
  is all content (so a model answering without thinking keeps its answer as content).

A whole output is split as vLLM's `extract_reasoning` does (text before a `<think>` the model
writes is dropped, though a stream has sent it already; an output cut inside an unclosed
`<think>` is all content for qwen3 and all reasoning for deepseek_r1). A stream is split as vLLM streams it: a tag that may be forming at
the end of a delta is held back, tags are never sent, and a qwen3 stream cut inside its think
block has sent that text as reasoning.

The engine gets `ThinkTags` with a request that has structured outputs, so the grammar starts
after the reasoning (tandem/sample/reasoning_gate.py).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from tandem.sample.reasoning_gate import ThinkTags

START, END = "<think>", "</think>"
REASONING, OPEN, CONTENT = "reasoning", "open", "content"  # where an output begins


class ThinkReasoningParser:
    name = ""

    def __init__(self, tokenizer: Any) -> None:
        vocab = tokenizer.get_vocab()
        self.start_token_id: Optional[int] = vocab.get(START)
        self.end_token_id: Optional[int] = vocab.get(END)
        if self.start_token_id is None or self.end_token_id is None:
            raise ValueError(f"--reasoning-parser {self.name}: the tokenizer has no "
                             f"{START} and {END} tokens, so this model does not write reasoning "
                             "in think tags")
        special = set(getattr(tokenizer, "all_special_tokens", []))
        # Tags that are special tokens vanish from the text with skip_special_tokens.
        self.tags_are_special = START in special or END in special

    def start_phase(self, prompt_ids: Sequence[int]) -> str:
        """REASONING, OPEN (qwen3: the output may open a think block) or CONTENT."""
        for t in reversed(prompt_ids):
            if t == self.end_token_id:
                return CONTENT
            if t == self.start_token_id:
                return REASONING
        return self._phase_without_tags

    _phase_without_tags = REASONING

    def think_tags(self, phase: str) -> Optional[ThinkTags]:
        """What the engine needs to start a grammar after the reasoning (None: from the start)."""
        if phase == CONTENT:
            return None
        return ThinkTags(self.start_token_id, self.end_token_id, in_reasoning=phase == REASONING)

    def extract(self, text: str, phase: str) -> tuple[Optional[str], Optional[str]]:
        """(reasoning, content) of a whole output."""
        if phase == CONTENT:
            return None, text
        if phase == OPEN and (START not in text or END not in text):
            return None, text
        before, tag, after = text.partition(START)
        text = after if tag else before
        if END not in text:
            return text, None
        reasoning, _, content = text.partition(END)
        return reasoning, content or None

    def stream(self, phase: str) -> ReasoningStream:
        return ReasoningStream(phase)


class Qwen3ReasoningParser(ThinkReasoningParser):
    name = "qwen3"
    _phase_without_tags = OPEN


class DeepSeekR1ReasoningParser(ThinkReasoningParser):
    name = "deepseek_r1"


REASONING_PARSERS = {"deepseek_r1": DeepSeekR1ReasoningParser, "qwen3": Qwen3ReasoningParser}


class ReasoningStream:
    """One streamed choice: text deltas in, (reasoning, content) deltas out."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self._buffer = ""  # text held back: it may end in the start of a tag
        self._started = phase == CONTENT  # a <think> was read (only the first one is a tag)

    def feed(self, delta: str) -> tuple[str, str]:
        self._buffer += delta
        reasoning, content = "", ""
        while self._buffer:
            if self.phase == CONTENT:
                content += self._buffer
                self._buffer = ""
                break
            # OPEN waits for <think> (text before it is content, as vLLM streams it);
            # REASONING for </think> (a <think> the model writes anyway is dropped).
            tags = (START,) if self.phase == OPEN else (END,) if self._started else (START, END)
            found = [(self._buffer.find(t), t) for t in tags if t in self._buffer]
            if not found:
                keep = max(_partial_suffix(self._buffer, t) for t in tags)
                text, self._buffer = self._buffer[:len(self._buffer) - keep], \
                    self._buffer[len(self._buffer) - keep:]
                if self.phase == OPEN:
                    content += text
                else:
                    reasoning += text
                break
            at, tag = min(found)
            if self.phase == OPEN:
                content += self._buffer[:at]
            else:
                reasoning += self._buffer[:at]
            self._buffer = self._buffer[at + len(tag):]
            self._started = True
            self.phase = CONTENT if tag == END else REASONING
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The held-back text at the end of the output (a tag that never completed)."""
        rest, self._buffer = self._buffer, ""
        return (rest, "") if self.phase == REASONING else ("", rest)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def make_reasoning_parser(name: Optional[str], tokenizer: Any) -> Optional[ThinkReasoningParser]:
    if name is None:
        return None
    return REASONING_PARSERS[name](tokenizer)

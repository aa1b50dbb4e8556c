"""Structured outputs after the reasoning: a reasoning model's grammar starts where its thinking
ends, as in vLLM (the grammar's mask applies only to tokens after the end-of-think token).

`ThinkTags` is what the server's reasoning parser (entrypoints/openai/reasoning_parsers.py) hands
the engine with a request; `ReasoningGrammar` wraps a sequence's `GrammarMatcher` with the same
interface, so the model runner (verify masks), the draft proposer (its grammar walk) and the stop
checker use it unchanged:

- phase "reasoning": every token is allowed and the grammar does not move, until the end token;
- phase "open" (Qwen3 without a think block opened by the prompt): the first token may be the
  start token, which begins the reasoning; any other first token is the grammar's;
- phase "grammar": the wrapped matcher decides.

Drafts walk through a phase change like any other token, and `rollback` undoes it, so the k + 1
masks of a verify step are right even when `</think>` is among the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

REASONING, OPEN, GRAMMAR = "reasoning", "open", "grammar"


@dataclass(frozen=True)
class ThinkTags:
    start_token_id: int
    end_token_id: int
    in_reasoning: bool  # the output starts inside reasoning (else its first token may open it)


class ReasoningGrammar:
    """A GrammarMatcher that waits for the end of the reasoning."""

    def __init__(self, grammar: Any, tags: ThinkTags) -> None:
        self.grammar = grammar
        self.vocab_size: int = grammar.vocab_size
        self.tags = tags
        self.phase = REASONING if tags.in_reasoning else OPEN
        # One entry per token taken by try_consume: (phase before it, whether the grammar took
        # it), so rollback restores both.
        self._walk: list[tuple[str, bool]] = []

    def _step(self, token: int) -> tuple[str, bool]:
        """The phase after `token`, and whether the grammar must consume it."""
        if self.phase == REASONING:
            return (GRAMMAR if token == self.tags.end_token_id else REASONING), False
        if self.phase == OPEN and token == self.tags.start_token_id:
            return REASONING, False
        return GRAMMAR, True

    def allowed(self) -> torch.Tensor:
        """[V] bool: what may come next."""
        if self.phase == REASONING:
            return torch.ones(self.vocab_size, dtype=torch.bool)
        mask = self.grammar.allowed()
        if self.phase == OPEN:
            mask[self.tags.start_token_id] = True
        return mask

    def masks(self, drafts: list[int]) -> torch.Tensor:
        """[len(drafts) + 1, V] bool: row j allows what may follow drafts[:j] (as
        GrammarMatcher.masks: rows past a refused draft allow everything)."""
        rows = [self.allowed()]
        walked = 0
        for d in drafts:
            if not self.try_consume(d):
                break
            walked += 1
            rows.append(self.allowed())
        self.rollback(walked)
        while len(rows) < len(drafts) + 1:
            rows.append(torch.ones(self.vocab_size, dtype=torch.bool))
        return torch.stack(rows)

    def consume(self, token: int) -> None:
        """A verified token."""
        phase, to_grammar = self._step(token)
        if to_grammar:
            self.grammar.consume(token)
        self.phase = phase

    def try_consume(self, token: int) -> bool:
        phase, to_grammar = self._step(token)
        if to_grammar and not self.grammar.try_consume(token):
            return False
        self._walk.append((self.phase, to_grammar))
        self.phase = phase
        return True

    def rollback(self, n: int) -> None:
        grammar_tokens = 0
        for _ in range(n):
            self.phase, to_grammar = self._walk.pop()
            grammar_tokens += to_grammar
        self.grammar.rollback(grammar_tokens)

    @property
    def finished(self) -> bool:
        return self.phase == GRAMMAR and self.grammar.finished

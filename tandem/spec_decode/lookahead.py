"""A lookup's tokens as the draft model's lookahead (beside a draft model, `lookup_method`).

Where a lookup expects the text to go on as it went before, the draft model most often would
draft those same tokens, one pass each. Fed after the context in the draft's catch-up pass,
they cost one pass for all: the pass's row for each such token is exactly the pass the draft
would have run after drafting it (the same positions and keys: a row's result never depends on
its batch), so while the draft's own tokens equal the lookup's, each next draft is read from a
row already computed, and at the first that differs the draft goes on a pass per token as
ever. The drafts, and their q, are the draft model's whatever the lookup said: the rejection
sampler sees a draft model, and the lookup only spares passes."""

from __future__ import annotations

from typing import Optional

from tandem.core.request import Request


def lookahead_tokens(req: Request, k: int, hints: Optional[dict[str, list[int]]]) -> list[int]:
    """The tokens to feed after `req`'s context in the catch-up pass: up to k - 1 of the
    lookup's (the last draft is never fed), none for a request that does not draft or a
    structured output (its grammar walks draft by draft). Only a draft of the target's
    vocabulary is given hints (CombinedProposer.lookahead): a TLI draft's tokens are not the
    lookup's."""
    if not hints or k < 2 or req.grammar is not None:
        return []
    return list(hints.get(req.request_id, ())[:k - 1])

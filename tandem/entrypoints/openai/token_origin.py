"""The opt-in response extension `spec_decode_token_origin`: where each generated token came from.

With `"spec_decode_token_origin": true` in a completion or chat request, each choice (each
chunk's choice when streaming) carries three lists with one entry per generated token of that
choice or chunk:
- `spec_decode_token_origin`: "draft" (a draft model's token the target accepted), "ngram" or
  "suffix" (an accepted token of that lookup, `method` or `lookup_method`) or "target" (a token
  the target produced itself: recovered after a rejection, a bonus token, or decoding without
  drafts);
- `spec_decode_token_ids`: the token ids;
- `spec_decode_rejected_draft`: null, or the text of the draft's guess the target rejected at
  that position.
"""

from __future__ import annotations

from typing import Any

from tandem.outputs import CompletionOutput


def token_origin_fields(tokenizer: Any, o: CompletionOutput, start: int) -> dict[str, Any]:
    """The extension's lists for tokens `start:` of `o`."""
    rejected = o.rejected_draft_ids[start:]
    return {"spec_decode_token_origin": o.token_origins[start:],
            "spec_decode_token_ids": o.token_ids[start:],
            "spec_decode_rejected_draft": [None if r is None else tokenizer.decode([r])
                                           for r in rejected]}

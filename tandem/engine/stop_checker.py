"""Stop conditions, checked after every appended token: token-level ones in vLLM's order, then
stop strings (through the sequence's detokenizer) and a completed structured output."""

from __future__ import annotations

from typing import Optional

from tandem.core.request import Request, RequestStatus
from tandem.engine.detokenizer import IncrementalDetokenizer


def check_stop(req: Request, max_model_len: int) -> Optional[RequestStatus]:
    p = req.params
    num_out = len(req.output_token_ids)
    last = req.output_token_ids[-1]
    if num_out >= p.min_tokens:
        if not p.ignore_eos and last == req.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if last in p._all_stop_token_ids:
            if last in p.stop_token_ids:
                req.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
    if p.max_tokens is not None and num_out >= p.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def check_finished(req: Request, detok: Optional[IncrementalDetokenizer],
                   max_model_len: int) -> Optional[RequestStatus]:
    """Every stop condition; `detok` (None for a sequence whose request is gone) sees the new
    token's text, which below min_tokens is never searched for stop strings."""
    status = check_stop(req, max_model_len)
    if detok is None:
        return status
    token_stop = status is RequestStatus.FINISHED_STOPPED
    if not token_stop or req.params.include_stop_str_in_output:
        # The stop token itself is not part of the text (as in vLLM).
        matched = detok.add_token(req.output_token_ids[-1],
                                  stops_allowed=len(req.output_token_ids) >= req.params.min_tokens)
        if matched is not None:
            req.stop_reason = matched
            return RequestStatus.FINISHED_STOPPED
    if status is None and req.grammar is not None and req.grammar.finished:
        return RequestStatus.FINISHED_STOPPED  # the structured output is complete
    return status

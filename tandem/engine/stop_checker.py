"""Token-level stop conditions, checked after every appended token (vLLM's order)."""

from __future__ import annotations

from typing import Optional

from tandem.core.request import Request, RequestStatus


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

"""POST /tokenize, POST /detokenize and GET /tokenizer_info: the shapes lm-evaluation-harness
probes for when it is not given a tokenizer of its own."""

from __future__ import annotations

import asyncio
from typing import Any

from tandem.entrypoints.chat_utils import apply_chat_template
from tandem.entrypoints.openai.errors import OpenAIError
from tandem.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from tandem.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        """Template rendering and tokenization run in a worker thread, off the event loop."""
        self.check_model(request.model)
        return await asyncio.to_thread(self._tokenize, request)

    def _tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        if request.messages is not None:
            try:
                text = apply_chat_template(
                    self.tokenizer, [m.model_dump(exclude_none=True) for m in request.messages],
                    self.chat_template, add_generation_prompt=request.add_generation_prompt,
                    continue_final_message=request.continue_final_message)
            except ValueError as e:
                raise OpenAIError(str(e), param="messages") from None
            # The template already holds BOS and friends.
            add_special = bool(request.add_special_tokens)
        else:
            text = request.prompt or ""
            add_special = True if request.add_special_tokens is None \
                else request.add_special_tokens
        tokens = list(self.tokenizer(text, add_special_tokens=add_special).input_ids)
        body: dict[str, Any] = {"count": len(tokens), "max_model_len": self.max_model_len,
                                "tokens": tokens}
        if request.return_token_strs:
            body["token_strs"] = self.tokenizer.convert_ids_to_tokens(tokens)
        return body

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        for t in request.tokens:
            if not 0 <= t < self.vocab_size:
                raise OpenAIError(f"Token id {t} is out of vocabulary (vocab size "
                                  f"{self.vocab_size}).", param="tokens")
        return {"prompt": self.tokenizer.decode(request.tokens)}

    def tokenizer_info(self) -> dict[str, Any]:
        tok = self.tokenizer
        return {"tokenizer_class": type(tok).__name__,
                "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
                "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
                "pad_token": tok.pad_token, "unk_token": tok.unk_token,
                "chat_template": self.chat_template or getattr(tok, "chat_template", None),
                "model_max_length": self.max_model_len, "vocab_size": self.vocab_size,
                "add_bos_token": getattr(tok, "add_bos_token", None)}

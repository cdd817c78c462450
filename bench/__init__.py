"""Benchmarks: minivlm vs HF transformers on the same random Qwen2.5-VL checkpoint (python -m bench)."""

"""The KV cache's bookkeeping: one coordinator (coordinator.py) over one manager per KV-cache group
(full_attention.py, sliding_window.py, recurrent.py), all answering the same calls."""

"""The batch's grammar bitmasks (structured outputs): one [n, words] tensor per step, filled by llguidance row by row,
then applied to the batch's logits in one pass (structured_output.apply_bitmasks).

When they are filled depends on whether a core is free while the forward runs. On an accelerator (or a CPU engine
that leaves a core to spare) they fill on a worker thread beside the forward, as vLLM overlaps them: a mask needs only
the tokens taken so far, the forward does not need the mask, and llguidance drops the GIL while it computes. Where
torch's threads take every core, a fill beside the forward only slows the forward by about what it hides (measured on
2 cores: the forward 0.3-0.5 ms slower at batch 8, the whole constrained step no faster; bench/structured_decode.py),
so the masks fill on the step thread when sampling asks for them."""
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch


def spare_core(device: str) -> bool:
    """Whether a thread beside the forward has a core of its own: an accelerator runs the forward, or torch's CPU
    threads leave one of this process's cores free."""
    return device != "cpu" or torch.get_num_threads() < len(os.sched_getaffinity(0))


class BatchMasks:
    """One step's masks: bits [n, words] int32, row i for the request seq_ids[i] (bit t of a row: token t allowed)."""

    def __init__(self, seq_ids: list[int], matchers: list):
        self.row = {seq_id: i for i, seq_id in enumerate(seq_ids)}
        self.matchers = matchers
        self.vocab_size = matchers[0].vocab_size
        self.bits = torch.empty(len(matchers), matchers[0].words, dtype=torch.int32)
        self.errors: dict[int, BaseException] = {}  # row -> what its matcher raised (the row allows nothing)
        self.filling: Future | None = None  # the worker's fill, when it runs beside the forward

    def wait(self) -> "BatchMasks":
        """Every row filled: the worker's fill waited for, or (none) filled now, on this thread."""
        if self.filling is not None:
            self.filling.result()
        elif self.matchers is not None:
            self.fill()
        self.matchers = None  # filled: nothing more to compute
        return self

    def fill(self):
        """Each matcher's mask into its row (llguidance writes it in place, the GIL released); a matcher that raises
        leaves its row empty and its error for sampling (that request fails, the others sample)."""
        for i, m in enumerate(self.matchers):
            try:
                m.fill(self.bits[i])
            except Exception as e:  # noqa: BLE001
                self.bits[i] = 0
                self.errors[i] = e

    def checked(self, reqs) -> "BatchMasks":
        """self, or what the matcher of one of reqs raised (sampling is retried request by request: that one fails)."""
        for r in reqs:
            if (error := self.errors.get(self.row.get(r.seq_id, -1))) is not None:
                raise error
        return self

    def counts(self) -> np.ndarray:
        """How many tokens each row allows: one popcount over the batch (bits past the vocabulary never count)."""
        words = self.bits.numpy().view(np.uint32)
        counts = np.bitwise_count(words).sum(axis=1, dtype=np.int64)
        if self.vocab_size % 32:  # the last word's bits past the vocabulary, if any are set
            counts -= np.bitwise_count(words[:, -1] >> np.uint32(self.vocab_size % 32))
        return counts


class MaskFiller:
    """Makes each step's BatchMasks; with `beside_forward`, one worker thread (started on the first grammar) fills
    them while the forward runs."""

    def __init__(self, beside_forward: bool):
        self.beside_forward = beside_forward
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self, reqs) -> BatchMasks | None:
        """The masks of reqs' grammars (the plan's sampling requests that have one), started filling beside the
        forward or left for sampling to fill; None if no request has a grammar."""
        reqs = [r for r in reqs if r.grammar is not None]
        if not reqs:
            return None
        masks = BatchMasks([r.seq_id for r in reqs], [r.grammar for r in reqs])
        if self.beside_forward:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")
                masks.filling = self._pool.submit(masks.fill)
        return masks

    def close(self):
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

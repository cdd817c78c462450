"""The batch's grammar bitmasks (structured outputs): one [n, words] tensor per step, filled by the grammar library
(xgrammar or llguidance) row by row, then applied to the batch's logits in one pass (structured_output.apply_bitmasks).

A mask needs only the tokens taken so far, so where a core is free beside the step thread (an accelerator runs the
forward, or torch's CPU threads leave a core) a step's masks start filling on a worker thread as soon as the step
before has advanced its matchers ("ahead": while that step ends and the next is planned; llguidance drops the GIL
while it computes), earlier than vLLM's fill beside the forward. Where the forward's threads take every core, the
masks fill on the step thread when sampling asks: on 2 cores the fill ahead was done before the next forward began
(0.12 ms for 8 rows), yet the whole constrained step was no faster (bench/structured_decode.py times all three
modes). Each row is its own llguidance call: its thread pool (LLExecutor) took milliseconds to wake beside the
forward's threads."""
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch


def default_mode(device: str) -> str:
    """"ahead" where a thread beside the step has a core of its own (an accelerator runs the forward, or torch's CPU
    threads leave one of this process's cores free), else "sampling"."""
    spare = device != "cpu" or torch.get_num_threads() < len(os.sched_getaffinity(0))
    return "ahead" if spare else "sampling"


class BatchMasks:
    """One step's masks: bits [n, words] int32, row i for the request seq_ids[i] (bit t of a row: token t allowed)."""

    def __init__(self, seq_ids: list[int], matchers: list):
        self.row = {seq_id: i for i, seq_id in enumerate(seq_ids)}
        self.key = [(seq_id, m.consumed) for seq_id, m in zip(seq_ids, matchers)]  # whose state, after how many tokens
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

    def settle(self):
        """The worker's fill, if one runs, ended (nothing computed here: these masks are not used)."""
        if self.filling is not None:
            self.filling.result()

    def fill(self):
        """Each matcher's mask into its row (the library writes it in place); a matcher that raises
        leaves its row empty and its error for sampling (that request fails, the others sample)."""
        for i, m in enumerate(self.matchers):
            try:
                m.fill(self.bits, i)
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
    """Makes each step's BatchMasks, filled where `mode` says (MODES): "ahead", on a worker thread from the moment the
    step before has advanced its matchers (while that step ends and the next is planned; what is left, beside the
    forward); "beside", on that thread from the start of the step's execution; "sampling", on the step thread when
    sampling asks."""
    MODES = ("ahead", "beside", "sampling")

    def __init__(self, mode: str):
        if mode not in self.MODES:
            raise ValueError(f"mask fill mode must be one of {self.MODES}, got {mode!r}")
        self.mode = mode
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._ahead: BatchMasks | None = None  # the next step's masks, filling since the last step's update

    def ahead(self, sampled, live: dict):
        """After a step's update ("ahead" mode): start filling the next step's masks of the requests it sampled for
        (seq_ids; those still running with a grammar), which a decode step will sample for next."""
        if self.mode != "ahead":
            return
        seqs = [s for i in sampled if (s := live.get(i)) is not None and s.matcher is not None]
        if seqs:
            self._ahead = self._fill_beside(BatchMasks([s.seq_id for s in seqs], [s.matcher for s in seqs]))

    def start(self, seqs) -> BatchMasks | None:
        """The masks of seqs' grammars (the step's sampling requests that have one): those filled ahead if they are
        these requests' at their current token, else started filling beside the forward or left for sampling to
        fill; None if no request has a grammar."""
        seqs = [s for s in seqs if s.matcher is not None]
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead.key == [(s.seq_id, s.matcher.consumed) for s in seqs]:
                return ahead
            ahead.settle()  # not this step's: its fill must end before any of its matchers advances
        if not seqs:
            return None
        masks = BatchMasks([s.seq_id for s in seqs], [s.matcher for s in seqs])
        return masks if self.mode == "sampling" else self._fill_beside(masks)

    def _fill_beside(self, masks: BatchMasks) -> BatchMasks:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")
            masks.filling = self._pool.submit(masks.fill)
        return masks

    def close(self):
        with self._lock:
            if self._ahead is not None:
                self._ahead.settle()
                self._ahead = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

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
    """One step's masks: bits [rows, words] int32 (bit t of a row: token t allowed). Request seq_ids[i] has one row,
    or, speculating (drafts[i] non-empty), one at its last token and one after each guess: row j is its grammar's mask
    after the guesses before j, as if those had been accepted (vLLM's spec-decode bitmask). row: seq_id -> its first
    row; rows: seq_id -> (first row, rows). marks: where each request stands (its length; default its matcher's
    tokens taken), read on the step thread: a fill along guesses moves the matchers while it runs."""

    def __init__(self, seq_ids: list[int], matchers: list, drafts: list[tuple] | None = None,
                 stops: list[frozenset] | None = None, ends: list[bool] | None = None, marks: list[int] | None = None):
        drafts = drafts or [()] * len(matchers)
        first = [0]
        for d in drafts:
            first.append(first[-1] + 1 + len(d))
        self.row = {seq_id: first[i] for i, seq_id in enumerate(seq_ids)}
        self.rows = {seq_id: (first[i], 1 + len(d)) for i, (seq_id, d) in enumerate(zip(seq_ids, drafts))}
        marks = marks if marks is not None else [m.consumed for m in matchers]
        self.key = [(seq_id, at, tuple(d)) for seq_id, at, d in zip(seq_ids, marks, drafts)]  # whose state, where,
        self.matchers, self.drafts = matchers, drafts  # along which guesses
        self.stops = stops or [frozenset()] * len(matchers)  # tokens its matcher is never fed (EOS)
        self.ends = ends or [True] * len(matchers)  # whether a stop token ends its answer (not ignore_eos)
        self.vocab_size = matchers[0].vocab_size
        self.bits = torch.empty(first[-1], matchers[0].words, dtype=torch.int32)
        self.errors: dict[int, BaseException] = {}  # row -> what its matcher raised (the row allows nothing)
        self.filling: Future | None = None  # the worker's fill, when it runs beside the forward
        self.source: tuple | None = None  # (masks filled ahead along longer guesses, the rows these take of them)

    def narrowed(self, masks: "BatchMasks") -> "BatchMasks":
        """These masks taken from `masks`, filled ahead for the same requests at the same tokens along guesses of
        which each of these is a prefix (the scheduler guesses fewer when the step's budget or free blocks are
        short): its rows are copied when this fills, after that fill has ended."""
        rows = [masks.row[seq_id] + j for seq_id, (_, n) in self.rows.items() for j in range(n)]
        self.source = (masks, torch.tensor(rows))
        return self

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
        """Each matcher's masks into its rows (the library writes them in place); a matcher that raises leaves its
        rows empty and its error for sampling (that request fails, the others sample)."""
        if self.source is not None:  # narrowed: the rows of masks filled ahead, once their fill has ended
            masks, rows = self.source
            masks.wait()
            self.bits.copy_(masks.bits[rows])
            self.errors = {at: e for seq_id, at in self.row.items() if (e := masks.errors.get(masks.row[seq_id]))}
            return
        for i, m in enumerate(self.matchers):
            at = self.row[self.key[i][0]]
            try:
                m.fill(self.bits, at)
                if self.drafts[i]:
                    fill_along_draft(m, self.bits, at, self.drafts[i], self.stops[i], self.ends[i])
            except Exception as e:  # noqa: BLE001
                self.bits[at:at + 1 + len(self.drafts[i])] = 0
                self.errors[at] = e

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


def fill_along_draft(matcher, bits: torch.Tensor, at: int, draft: tuple, stops: frozenset, ends: bool):
    """Rows at + 1 .. at + len(draft) of bits: the matcher's mask after each guess (row at holds it before the first),
    the matcher walked over the guesses the grammar allows and rolled back, so it ends where it began. The walk stops
    at a guess the grammar forbids (verification rejects it there), after one that completes the grammar, and at a
    stop token that ends the answer: the rows after it are never read (every token allowed, so sampling them is
    defined). A stop token that does not end the answer (ignore_eos) is not fed, as the output path does not."""
    bits[at + 1:at + 1 + len(draft)] = -1
    walked = 0
    try:
        for j, token in enumerate(draft):
            row = at + j
            if not int(bits[row, token // 32]) >> (token % 32) & 1:
                return  # the grammar forbids this guess
            if token in stops:
                if ends:
                    return
                bits[row + 1] = bits[row]
                continue
            matcher.advance(token)
            walked += 1
            if matcher.finished():
                return  # the answer ends with this guess
            matcher.fill(bits, row + 1)
    finally:
        matcher.rollback(walked)


class MaskFiller:
    """Makes each step's BatchMasks, filled where `mode` says (MODES): "ahead", on a worker thread from the moment the
    step before has advanced its matchers (while that step ends and the next is planned; what is left, beside the
    forward); "beside", on that thread from the start of the step's execution; "sampling", on the step thread when
    sampling asks."""
    MODES = ("ahead", "beside", "sampling")

    def __init__(self, mode: str, stops=frozenset()):
        if mode not in self.MODES:
            raise ValueError(f"mask fill mode must be one of {self.MODES}, got {mode!r}")
        self.mode = mode
        self.stops = frozenset(stops)  # the model's EOS tokens: the output path never feeds them to a matcher
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._ahead: BatchMasks | None = None  # the next step's masks, filling since the last step's update

    def ahead(self, sampled, live: dict, upcoming=None):
        """After a step's update ("ahead" mode): start filling the next step's masks of the requests it sampled for
        (seq_ids, speculating ones included; those still running with a grammar), which a decode step will sample for
        next; upcoming(seq): the
        guesses a speculating one will verify (the speculator's, of which the step takes a prefix), a row after each."""
        if self.mode != "ahead":
            return
        seqs = [s for i in sampled if (s := live.get(i)) is not None and s.matcher is not None]
        if seqs:
            self._ahead = self._fill_beside(self._masks(seqs, [tuple(upcoming(s)) if upcoming else () for s in seqs]))

    def _masks(self, seqs: list, guesses: list[tuple]) -> BatchMasks:
        return BatchMasks([s.seq_id for s in seqs], [s.matcher for s in seqs], guesses, [self.stops] * len(seqs),
                          [not s.params.ignore_eos for s in seqs], [len(s) for s in seqs])

    def start(self, seqs, drafts: dict | None = None) -> BatchMasks | None:
        """The masks of seqs' grammars (the step's sampling requests that have one; drafts: seq_id -> the guesses a
        speculating one verifies, a row after each): those filled ahead if they are these requests' at their current
        token (along these guesses, or longer ones whose rows these take), else started filling beside the forward or
        left for sampling to fill; None if no request has a grammar."""
        seqs = [s for s in seqs if s.matcher is not None]
        guesses = [tuple((drafts or {}).get(s.seq_id, ())) for s in seqs]
        ahead, self._ahead = self._ahead, None
        wanted = [(s.seq_id, len(s), d) for s, d in zip(seqs, guesses)]
        if ahead is not None:
            if ahead.key == wanted:
                return ahead
            filled = {seq_id: (at, d) for seq_id, at, d in ahead.key}  # in another order, or along longer guesses
            if len(filled) == len(wanted) and all(seq_id in filled and filled[seq_id][0] == at and
                                                  filled[seq_id][1][:len(d)] == d for seq_id, at, d in wanted):
                return self._fill_beside(self._masks(seqs, guesses).narrowed(ahead))
            ahead.settle()  # not this step's: its fill must end before any of its matchers advances
        if not seqs:
            return None
        masks = self._masks(seqs, guesses)
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

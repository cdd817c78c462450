"""Structured outputs: a request's JSON schema, regex, choice or grammar becomes a matcher that, at every step,
says which tokens may come next (a bitmask over the vocabulary), so the answer is valid by construction. The
grammar engine is llguidance (vLLM's `guidance` backend; a Rust wheel with no Python dependencies, where xgrammar's
Linux wheel pulls triton): compiled on the caller's thread at intake (never in the step loop), cached by key, each
compile and each mask held to a stated budget (BUDGET, docs/HTTP_API.md measures it), a bad grammar refused naming the
field."""
import json
import threading
from collections import OrderedDict

import llguidance
import llguidance.hf
import numpy as np
import torch

from minivlm.refusals import Refused

# what one grammar may cost (llguidance's own limits): the lexer's work per token and at the start, its states and the
# grammar's size; past them the matcher stops with an error instead of stalling the step loop
BUDGET = llguidance.LLParserLimits(initial_lexer_fuel=200_000, step_lexer_fuel=200_000, max_lexer_states=50_000,
                                   max_grammar_size=200_000, step_max_items=50_000, verbose_errors=False)
MAX_SOURCE_CHARS = 100_000  # a schema, regex or grammar longer than this is refused before it is compiled
CACHE_SIZE = 64             # compiled grammars kept (a key is the kind and its text)


def source(so) -> tuple[str, str, str]:
    """(llguidance format, text, the field at fault) of a StructuredOutputsParams. JSON is compact (no free
    whitespace between tokens, vLLM's disable_any_whitespace; with free whitespace a small model writes newlines
    until max_tokens)."""
    if so.json is not None or so.json_object:
        schema = {"type": "object"} if so.json_object else so.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise Refused("invalid_value", "structured_outputs.json is not valid JSON: {error}",
                              param="structured_outputs.json", error=str(e)) from None
        if not isinstance(schema, dict):
            raise Refused("invalid_value", "structured_outputs.json must be a JSON Schema object",
                          param="structured_outputs.json")
        schema = {**schema, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ",
                                           "key_separator": ": ", **schema.get("x-guidance", {})}}
        return "json_schema", json.dumps(schema), "json_object" if so.json_object else "json"
    if so.regex is not None:
        return "regex", so.regex, "regex"
    if so.choice is not None:
        return "choice", json.dumps(so.choice), "choice"
    return "gbnf", so.grammar, "grammar"


class GrammarCompiler:
    """One per engine: the tokenizer as llguidance sees it, and each compiled grammar by key, as a matcher at its
    start that requests copy (a copy shares the compiled lexer and parser tables: n choices compile once)."""
    backend = "guidance"

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.vocab_size = vocab_size
        self.cache: OrderedDict[tuple, llguidance.LLMatcher] = OrderedDict()
        self.lock = threading.Lock()  # callers' threads compile concurrently

    def compiled(self, so) -> llguidance.LLMatcher:
        """A request's StructuredOutputsParams compiled (cached), or Refused naming the field. Checked here, on the
        caller's thread and within BUDGET: it compiles, computes its first mask and takes a first token (on a copy),
        so a grammar that outgrows the budget only once it moves (a repetition that unrolls a million states, a
        parser row of thousands of items) is refused before it reaches the step loop."""
        fmt, text, field = source(so)
        if len(text) > MAX_SOURCE_CHARS:
            raise Refused("invalid_value", "structured_outputs.{field} is {n} characters; the limit is {limit}",
                          reason="grammar_too_long", param=f"structured_outputs.{field}", field=field, n=len(text),
                          limit=MAX_SOURCE_CHARS)
        key = (fmt, text)
        with self.lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        try:
            start = llguidance.LLMatcher(self.tokenizer, llguidance.grammar_from(fmt, text), limits=BUDGET)
        except Exception as e:  # llguidance raises its own kinds for a grammar it cannot convert
            start, invalid = None, str(e)
        else:
            invalid = start.get_error() if start.is_error() else ""
        if invalid:
            raise Refused("invalid_value", "structured_outputs.{field} does not compile: {error}",
                          reason="grammar_invalid", param=f"structured_outputs.{field}", field=field,
                          error=_said(invalid))
        complex_ = self._first_step_error(start)
        if complex_:
            raise Refused("invalid_value", "structured_outputs.{field} is too complex: {error}",
                          reason="grammar_complex", param=f"structured_outputs.{field}", field=field,
                          error=_said(complex_))
        with self.lock:
            self.cache[key] = start
            while len(self.cache) > CACHE_SIZE:
                self.cache.popitem(last=False)
        return start

    def _first_step_error(self, start: llguidance.LLMatcher) -> str:
        """The budget error of the first mask or the first token (its lowest allowed one but EOS), if any."""
        probe = Matcher(start.deep_copy(), self.vocab_size)
        first = allowed_ids(probe.allowed(), self.vocab_size).tolist()  # the lexer's first states are built here
        token = next((t for t in first if t != self.tokenizer.eos_token), None)
        if token is not None and not probe.error():
            probe.m.consume_token(token)
        return probe.error()

    def matcher(self, so) -> "Matcher":
        """A fresh matcher for one request (a copy of the compiled grammar at its start)."""
        start = self.compiled(so)
        with self.lock:
            return Matcher(start.deep_copy(), self.vocab_size)


def _said(error: str) -> str:
    """llguidance's error as the refusal quotes it (BUDGET keeps its state dump out: a schema is the caller's)."""
    return error.replace("<non-verbose/>", "").strip()[:500]


class Matcher:
    """One request's grammar state: the tokens it allows next, advanced by each token the request samples."""

    def __init__(self, matcher, vocab_size: int):
        self.m, self.vocab_size = matcher, vocab_size
        self.words = (vocab_size + 31) // 32
        self.consumed = 0  # tokens it has taken

    def allowed(self) -> torch.Tensor:
        """The next token's bitmask [words] (int32, bit i of word i // 32 = token i allowed), a fresh tensor."""
        mask = torch.empty(1, self.words, dtype=torch.int32)
        self.fill(mask, 0)
        return mask[0]

    def fill(self, bits: torch.Tensor, row: int):
        """The next token's bitmask into bits[row] (bits: a contiguous [n, words] int32 tensor), in place: llguidance
        writes it directly, with the GIL released (engine/sampling/grammar_masks.py may run this beside the forward)."""
        self.m.unsafe_compute_mask_ptr(bits.data_ptr() + row * self.words * 4, self.words * 4)

    def advance(self, token: int):
        if not self.m.consume_token(token):  # the grammar ran past its budget mid-answer (else the mask forbade it)
            raise Refused("invalid_value", "structured_outputs: the grammar stopped within its budget after {n} "
                          "tokens ({error}); simplify the schema, regex or grammar", param="structured_outputs",
                          n=self.consumed, error=(self.m.get_error() or "a token it did not allow")[:200])
        self.consumed += 1

    def rollback(self, n: int):
        """Forget the last n tokens taken (speculative decoding: the guesses walked for their masks)."""
        if n and not self.m.rollback(n):
            raise RuntimeError(f"llguidance could not roll back {n} token(s): {self.m.get_error()}")
        self.consumed -= n

    def finished(self) -> bool:
        """The grammar can take no more tokens: the answer is complete."""
        return self.m.is_stopped()

    def error(self) -> str:
        return self.m.get_error() if self.m.is_error() else ""

    def copy(self) -> "Matcher":
        return Matcher(self.m.deep_copy(), self.vocab_size)


def apply_bitmasks(logits: torch.Tensor, rows: list[int], bits: torch.Tensor):
    """Disallowed tokens of the constrained rows to -inf, in place, in one call over the batch: bits [len(rows),
    words] holds the masks of logits' rows `rows`. On the CPU numpy unpacks the bits and fills in one pass:
    llguidance's kernel is torch.compile'd, and its generated kernel with its OpenMP pool (like torch's row gather and
    scatter) took milliseconds a step on a busy 2-core machine, more than a small model's whole decode step
    (bench/structured_decode.py); on an accelerator llguidance's kernel runs."""
    if not rows:
        return
    if logits.device.type != "cpu":
        import llguidance.torch as lltorch  # torch.compile'd: imports torch._dynamo, and triton where installed
        full = torch.full((logits.shape[0], bits.shape[1]), -1, dtype=torch.int32)  # -1: all allowed
        full[rows] = bits
        lltorch.apply_token_bitmask_inplace(logits, full.to(logits.device))
        return
    words = bits.numpy()
    if rows != list(range(logits.shape[0])):  # some rows unconstrained: every bit of theirs set
        words = np.full((logits.shape[0], bits.shape[1]), -1, dtype=np.int32)
        words[rows] = bits.numpy()
    allowed = np.unpackbits(words.view(np.uint8), axis=1, count=logits.shape[1], bitorder="little")  # past the
    np.copyto(logits.numpy(), -np.inf, where=allowed == 0)  # mask's width: 0, never allowed; one pass, no indexing


FEW = 32  # a step-through line lists the allowed ids when at most this many


def allowed_ids(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The token ids a bitmask allows (the step-through: "allowed 14 of 662 tokens"). numpy unpacks the words'
    bytes (little-endian: bit i of the mask is bit i % 8 of byte i // 8)."""
    bits = np.unpackbits(mask.numpy().view(np.uint8), count=vocab_size, bitorder="little")
    return torch.from_numpy(np.flatnonzero(bits))


def constrained_events(events, masks, sampled: dict, seqs: dict, token_text):
    """The step-through's lines for a step's grammar-constrained requests: how many of the vocab's tokens each
    grammar allowed (their ids when few: the rows that allow at most FEW unpacked together, one numpy pass for the
    batch, where a pass per row had cost as much as the masks' fill), which one was chosen. masks: the step's
    BatchMasks; sampled: seq_id -> (token, logprobs); token_text: a token id's text."""
    vocab, counts = masks.vocab_size, masks.counts()
    few = [i for i in masks.row.values() if counts[i] <= FEW]
    ids = {}
    if few:
        allowed = np.unpackbits(masks.bits.numpy()[few].view(np.uint8), axis=1, count=vocab, bitorder="little")
        ids = {i: np.flatnonzero(bits).tolist() for i, bits in zip(few, allowed)}
    for seq_id, i in masks.row.items():  # a speculating request's first row: the mask before its guesses
        count = int(counts[i])
        if seq_id in sampled and (seq := seqs.get(seq_id)) is not None:
            token = sampled[seq_id][0]
            events.emit("constrained", seq.request_id, allowed=count, vocab=vocab, token=token, text=token_text(token),
                        allowed_ids=ids.get(i))

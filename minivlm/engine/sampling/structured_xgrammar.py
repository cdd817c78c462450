"""Structured outputs through xgrammar (vLLM's and SGLang's default backend), where it is installed: the same
requests as structured_output.py's llguidance matchers, with masks that cost 2-3 µs a row where llguidance's cost
20-25 µs (the shipped tiny model's bench grammars: xgrammar precomputes, per grammar state, the tokens whose answer
does not depend on the stack). Every grammar still passes llguidance's compiler first: its limits are the stated
budget (structured_output.BUDGET: a pathological schema or regex is refused before xgrammar sees it), and its
refusals name the field; a grammar llguidance accepts and xgrammar cannot build is served by llguidance (vLLM's
"auto" falls back the same way). xgrammar's Linux wheel requires triton (a 286 MB download a CPU never uses), so it is
not a requirement: `pip install --no-deps xgrammar apache-tvm-ffi` on a CPU (docs/HTTP_API.md)."""
import json

import torch
import xgrammar

from minivlm.engine.sampling.structured_output import GrammarCompiler, allowed_ids, source
from minivlm.refusals import Refused


class XGrammarCompiler:
    """One per engine: llguidance's compiler (the budget and the refusals) and xgrammar's (the masks), each grammar
    compiled once by key (xgrammar's own cache keeps its compiled grammars)."""
    backend = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int):
        self.guard = GrammarCompiler(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.xg = xgrammar.GrammarCompiler(self.info, max_threads=1)  # the caller's thread: never the step loop's

    def compiled(self, so):
        """A request's StructuredOutputsParams checked by llguidance (Refused naming the field, past BUDGET too) and
        compiled by xgrammar; None where xgrammar cannot build what llguidance accepted (llguidance serves it)."""
        self.guard.compiled(so)
        fmt, text, _ = source(so)
        try:
            if fmt == "json_schema":
                schema = json.loads(text)
                schema.pop("x-guidance", None)  # llguidance's whitespace settings: the same, said to xgrammar
                return self.xg.compile_json_schema(schema, any_whitespace=False, separators=(", ", ": "),
                                                   strict_mode=False)  # JSON Schema's open objects, as llguidance
            if fmt == "regex":
                return self.xg.compile_regex(text)
            if fmt == "choice":
                return self.xg.compile_grammar("root ::= " + " | ".join(
                    json.dumps(c, ensure_ascii=False) for c in json.loads(text)))
            return self.xg.compile_grammar(text)
        except Exception:  # noqa: BLE001 -- a feature xgrammar lacks: llguidance serves this grammar
            return None

    def matcher(self, so):
        """A fresh matcher for one request: xgrammar's, or llguidance's where xgrammar cannot build the grammar."""
        grammar = self.compiled(so)
        if grammar is None:
            return self.guard.matcher(so)
        return XMatcher(xgrammar.GrammarMatcher(grammar), self.vocab_size, self.info.stop_token_ids)


class XMatcher:
    """One request's grammar state in xgrammar, as structured_output.Matcher's (the engine uses either)."""

    def __init__(self, matcher, vocab_size: int, stop_ids):
        self.m, self.vocab_size, self.stop_ids = matcher, vocab_size, set(stop_ids)
        self.words = (vocab_size + 31) // 32
        self.consumed = 0  # tokens it has taken
        self._done = None  # finished(), once computed for this state

    def allowed(self) -> torch.Tensor:
        """The next token's bitmask [words] (int32, bit i of word i // 32 = token i allowed), a fresh tensor."""
        mask = torch.empty(1, self.words, dtype=torch.int32)
        self.fill(mask, 0)
        return mask[0]

    def fill(self, bits: torch.Tensor, row: int):
        """The next token's bitmask into bits[row] (bits: a contiguous [n, words] int32 tensor), in place (the batch's
        own tensor and an index: a view made per row cost 4x the mask, 7 against 1.8 µs)."""
        self.m.fill_next_token_bitmask(bits, row)

    def advance(self, token: int):
        if not self.m.accept_token(token):  # the mask forbade it: the caller sampled outside it
            raise Refused("invalid_value", "structured_outputs: the grammar did not allow token {token} after {n} "
                          "tokens", param="structured_outputs", token=token, n=self.consumed)
        self.consumed += 1
        self._done = None

    def rollback(self, n: int):
        """Forget the last n tokens taken (speculative decoding: the guesses walked for their masks)."""
        if n:
            self.m.rollback(n)  # a matcher built without max_rollback_tokens keeps every step (xgrammar 0.2)
            self.consumed -= n
            self._done = None

    def finished(self) -> bool:
        """The grammar can take no more tokens (llguidance's is_stopped): complete, and its mask allows nothing but a
        stop token. Only a complete grammar builds that mask, once per state."""
        if self._done is None:
            self._done = self.m.is_terminated() or (self.m.is_completed() and self._only_stops())
        return self._done

    def _only_stops(self) -> bool:
        return set(allowed_ids(self.allowed(), self.vocab_size).tolist()) <= self.stop_ids

    def error(self) -> str:
        return ""  # xgrammar has no budget to run past: its work per token is bounded by the compiled grammar

    def copy(self) -> "XMatcher":
        twin = XMatcher(self.m.fork(), self.vocab_size, self.stop_ids)
        twin.consumed = self.consumed
        return twin

"""The output path: sampled tokens -> text, stop strings, finish reasons, and the Output a caller receives.
Text is decoded incrementally (a few tokens per step), so decoding a request of n tokens costs O(n) tokenizer work,
not O(n²); each StreamEvent's `text` (the text so far, a str as the API promises) is still one copy per event."""
import functools

from minivlm.engine.outputs import Output, StreamEvent

MAX_CHAR_TOKENS = 6  # a UTF-8 character is at most 4 bytes: a window this long that still ends mid-character is junk


def one_token_text(tokenizer, size: int = 16384):
    """A token's text alone (cached): what a decode step's settled window holds, the previous token."""
    return functools.lru_cache(maxsize=size)(lambda token: tokenizer.decode([token], skip_special_tokens=True))


class IncrementalDetokenizer:
    """The text of a growing token list. Each new token decodes only the window since the last settled
    character boundary; while the window ends in U+FFFD (a multi-byte character split across tokens) the
    text waits. Stop strings are searched only where new text could complete one, and the last
    (longest stop - 1) characters are held back from streaming, so streamed deltas never need retracting."""

    def __init__(self, tokenizer, stop: list[str] | None, token_text=None):
        self.tokenizer = tokenizer
        self.token_text = token_text or one_token_text(tokenizer)  # the OutputProcessor's, shared by its requests
        self.stop = [s for s in stop or [] if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.window = 0        # ids[window:] may still change how their text decodes
        self.text = ""         # the text of ids[:read], cut before a stop string once one matched
        self.read = 0
        self.sent = 0          # characters of text already streamed
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        if len(ids) == 1:  # a decode step's settled window: half its decoding becomes a lookup
            return self.token_text(ids[0])
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> bool:
        """Add one token; returns True when a stop string matched (the text is cut before it)."""
        self.ids.append(token_id)
        settled = self._decode(self.ids[self.window:self.read])
        grown = self._decode(self.ids[self.window:])
        if grown.endswith("\ufffd") and len(self.ids) - self.read < MAX_CHAR_TOKENS:
            return False  # the rest of a character is still to come
        start = len(self.text)
        self.text += grown[len(settled):]
        self.window, self.read = self.read, len(self.ids)
        return self._cut_at_stop(start)

    def _cut_at_stop(self, new_from: int) -> bool:
        """Cut text before the earliest stop string that ends inside the text added at new_from."""
        lo = max(0, new_from - self.hold)
        found = [i for i in (self.text.find(s, lo) for s in self.stop) if i >= 0]
        if found:
            self.text, self.stopped = self.text[:min(found)], True
        return bool(found)

    def finish(self):
        """Settle whatever is still waiting (a trailing incomplete character decodes as U+FFFD, as a full decode does)."""
        if self.read < len(self.ids) and not self.stopped:
            start = len(self.text)
            self.text += self._decode(self.ids[self.window:])[len(self._decode(self.ids[self.window:self.read])):]
            self.read = len(self.ids)
            self._cut_at_stop(start)

    def delta(self, finished: bool) -> str:
        """Text not streamed yet that can no longer change."""
        ready = len(self.text) if finished else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:ready], ready
        return out


class OutputProcessor:
    """Turns each sampled token of a sequence into a StreamEvent and, at the end, its Output."""

    def __init__(self, tokenizer, eos_ids: set[int], max_model_len: int):
        self.tokenizer, self.eos_ids, self.max_model_len = tokenizer, eos_ids, max_model_len
        self.token_text = one_token_text(tokenizer)

    def start(self, seq):
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, seq.params.stop, self.token_text)

    def advance(self, seq, token: int, logprobs: dict | None) -> tuple[StreamEvent, str | None]:
        """Append a sampled token; returns its event and the finish reason (None while the request goes on)."""
        seq.append_token(token)
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        p, reason = seq.params, None
        if seq.matcher is not None and token not in self.eos_ids:
            seq.matcher.advance(token)
        if not p.ignore_eos and token in self.eos_ids:
            reason = "stop"
        elif seq.matcher is not None and seq.matcher.finished():
            reason = "stop"  # the grammar is complete: the answer is valid as it stands
        elif seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            reason = "length"
        detok = seq.detokenizer
        if detok.push(token):
            reason = "stop"
        elif reason:
            detok.finish()
            reason = "stop" if detok.stopped else reason
        delta = detok.delta(finished=reason is not None)
        return StreamEvent(seq.request_id, delta, detok.text[:detok.sent], False, None, token_ids=[token],
                           logprobs=None if logprobs is None else [logprobs], index=seq.choice_index), reason

    @staticmethod
    def output(seq, reason: str) -> Output:
        return Output(seq.request_id, seq.detokenizer.text, seq.output_ids, reason, seq.num_prompt_tokens,
                      seq.num_cached_tokens, list(seq.cache_hits), seq.logprobs, [n for im in seq.images for n in im.notes],
                      seq.choice_index)

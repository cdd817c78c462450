"""Incremental detokenisation: O(n) work, multi-byte characters split across tokens, stop strings across steps."""
import pytest
from transformers import AutoTokenizer

from minivlm.config import DEFAULT_MODEL
from minivlm.engine.sampling.output_processor import IncrementalDetokenizer

TEXT = "Le cœur a ses raisons — 世界は広い 🎉🙂 naïve café, ünïcödé… ok. "


class CountingTokenizer:
    """The real tokenizer, counting how many token ids it is asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kw)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL)


def long_ids(tokenizer, n=2000):
    ids = []
    while len(ids) < n:
        ids += tokenizer.encode(TEXT)
    return ids[:n]


def stream(detok: IncrementalDetokenizer, ids) -> tuple[str, int]:
    """Push ids one at a time as the engine does; returns (concatenated deltas, tokens pushed)."""
    out, n = "", 0
    for n, token in enumerate(ids, 1):
        stopped = detok.push(token)
        out += detok.delta(finished=stopped or n == len(ids))
        if stopped:
            break
    else:
        detok.finish()
        out += detok.delta(finished=True)
    return out, n


def test_2000_multibyte_tokens_equal_the_full_decode_in_linear_work(tokenizer):
    ids = long_ids(tokenizer)
    assert sum(len(tokenizer.decode([t])) == 1 and tokenizer.decode([t]) == "\ufffd" for t in ids) > 100  # split chars
    counting = CountingTokenizer(tokenizer)
    detok = IncrementalDetokenizer(counting, None)
    streamed, _ = stream(detok, ids)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert streamed == detok.text == full
    assert counting.decoded <= 16 * len(ids), f"decoded {counting.decoded} ids for {len(ids)} tokens: not O(n)"


def test_a_decode_step_asks_the_tokenizer_once_the_previous_token_is_looked_up(tokenizer):
    """Each pushed token decodes its window (the previous token and itself) and the settled part, the previous token
    alone: that one comes from the shared one-token cache, so the tokenizer is asked one call a token, not two, and the
    text is still the full decode."""
    ids = long_ids(tokenizer, 600)
    counting = CountingTokenizer(tokenizer)
    calls = []
    counting.decode = lambda ids, **kw: calls.append(len(ids)) or tokenizer.decode(ids, **kw)
    detok = IncrementalDetokenizer(counting, None)
    streamed, _ = stream(detok, ids)
    assert streamed == tokenizer.decode(ids, skip_special_tokens=True)
    singles = sum(n == 1 for n in calls)
    assert singles <= len(set(ids)), f"{singles} one-token decodes for {len(set(ids))} distinct tokens: not cached"
    assert len(calls) < 1.5 * len(ids), f"{len(calls)} tokenizer calls for {len(ids)} tokens (2 a token uncached)"


@pytest.mark.parametrize("stop", ["世界", "🙂 naïve", "ok. Le", "… ok"])
def test_stop_strings_spanning_tokens_and_steps_cut_where_the_full_decode_would(tokenizer, stop):
    ids = tokenizer.encode("Intro: ") + long_ids(tokenizer)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert len(tokenizer.encode(stop)) > 1 and full.count(stop) > 10
    detok = IncrementalDetokenizer(tokenizer, ["never occurs", stop])
    streamed, pushed = stream(detok, ids)
    assert detok.stopped and streamed == detok.text == full[:full.index(stop)]
    completes = next(k for k in range(1, len(ids)) if stop in tokenizer.decode(ids[:k]))
    assert pushed == completes, "generation stops at the token that completes the first occurrence"


def test_no_stop_text_is_streamed_before_it_is_certain(tokenizer):
    ids = tokenizer.encode("abc STOP def")
    detok = IncrementalDetokenizer(tokenizer, ["STOP"])
    deltas = []
    for token in ids:
        if detok.push(token):
            deltas.append(detok.delta(finished=True))
            break
        deltas.append(detok.delta(finished=False))
    assert "".join(deltas) == "abc " and not any("S" in d for d in deltas)

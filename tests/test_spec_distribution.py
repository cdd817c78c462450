"""Sampled speculation keeps the distribution decoding one token at a time has (#55 item 3), with a logit bias,
penalties and a grammar mask shaping every position: chi-square tests against the target computed by hand from the
logits (fast, a vocabulary of 8), and, on the shipped model, the answers of many seeds with and without speculation
(slow)."""
import math
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO
from minivlm.engine.execution.input_batch import RequestState
from minivlm.engine.sampling.grammar_masks import BatchMasks
from minivlm.engine.spec_decode.rejection_sampler import verify_request

VOCAB, DRAWS = 8, 4000
P = SamplingParams(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6,
                   logit_bias={5: 1.0})
PROMPT, ANSWER = [0, 3], [3, 6]
FORBIDDEN = [{7}, {2, 7}, {1}]  # the grammar's mask at each position: tokens it forbids


def target(logits: list[float], history: list[int], forbidden: set[int]) -> list[float]:
    """The distribution one token is sampled from after `history` (prompt + answer), by hand: bias, repetition over
    every token seen, frequency and presence over the answer, the mask, temperature, softmax."""
    answer = history[len(PROMPT):]
    row = []
    for t, x in enumerate(logits):
        x += P.logit_bias.get(t, 0.0)
        if t in history:
            x = x / P.repetition_penalty if x > 0 else x * P.repetition_penalty
        x -= P.frequency_penalty * answer.count(t) + P.presence_penalty * (t in answer)
        row.append(-math.inf if t in forbidden else x / P.temperature)
    top = max(row)
    weights = [math.exp(x - top) for x in row]
    return [w / sum(weights) for w in weights]


def fit(counts: list[int], probs: list[float]) -> float:
    """Chi-square goodness of fit of counts to probs (tokens of probability 0 must never appear): its p-value."""
    assert all(c == 0 for c, p in zip(counts, probs) if p == 0), (counts, probs)
    seen = [(c, p) for c, p in zip(counts, probs) if p > 0]
    n = sum(counts)
    return chisquare([c for c, _ in seen], [p * n for _, p in seen]).pvalue


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: torch's thread pool only costs here (milliseconds a call on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # 4,000 verifications: 13 s on a busy 2-core machine
def test_each_position_follows_the_distribution_its_token_would_be_sampled_from():
    """4,000 verifications of one 2-token draft: the first emitted token follows the first position's target; given
    the first guess accepted, the second follows the target after it (its penalties count it); given both, the bonus
    token the target after both. Forbidden tokens never appear. Each p-value > 1e-4."""
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 1.5
    masks = BatchMasks([0], [SimpleNamespace(vocab_size=VOCAB, words=1, consumed=0)], [(0, 0)])
    for j, banned in enumerate(FORBIDDEN):
        masks.bits[j] = sum(1 << t for t in range(VOCAB) if t not in banned)
    t0 = target(logits[0].tolist(), PROMPT + ANSWER, FORBIDDEN[0])
    draft = (max(range(VOCAB), key=lambda t: t0[t] * (t != 3)), 0)  # a likely first guess, then token 0
    t1 = target(logits[1].tolist(), PROMPT + ANSWER + [draft[0]], FORBIDDEN[1])
    draft = (draft[0], max(range(VOCAB), key=lambda t: t1[t]))  # the likeliest second guess
    masks.drafts = [draft]
    t2 = target(logits[2].tolist(), PROMPT + ANSWER + list(draft), FORBIDDEN[2])
    state = RequestState(0, "r", P, torch.Generator().manual_seed(1), PROMPT + ANSWER, len(PROMPT))
    first, second, third = [0] * VOCAB, [0] * VOCAB, [0] * VOCAB
    for _ in range(DRAWS):
        out = verify_request(logits, draft, state, masks)
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
        if len(out) > 2:
            third[out[2]] += 1
    assert sum(second) == first[draft[0]] and sum(third) == second[draft[1]] > 300
    for counts, probs in ((first, t0), (second, t1), (third, t2)):
        assert fit(counts, probs) > 1e-4, (counts, [round(p * sum(counts)) for p in probs])


@pytest.mark.slow  # its pair: 3,000 draws
def test_the_test_can_fail():
    """The chi-square above tells the second position's target from the distribution a verification that forgot the
    accepted guess (its penalties counting the history before the step only) would sample from: 3,000 draws of the
    latter do not fit the former."""
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 1.5
    t0 = target(logits[0].tolist(), PROMPT + ANSWER, set())
    guess = max(range(VOCAB), key=lambda t: t0[t] * (t not in ANSWER))  # a token the answer does not hold yet
    t1 = target(logits[1].tolist(), PROMPT + ANSWER + [guess], set())
    forgot = RequestState(0, "r", P, torch.Generator().manual_seed(2), PROMPT + ANSWER, len(PROMPT))
    counts = [0] * VOCAB
    for _ in range(3000):
        counts[verify_request(logits[1:2], (), forgot)[0]] += 1
    assert fit(counts, t1) < 1e-4


FIVE = 'root ::= item ", " item ", " item ", " item ", " item "."\nitem ::= colour " " shape\n' \
       'colour ::= "red" | "blue"\nshape ::= "circle" | "square"'


@pytest.mark.slow  # 2 x 300 sampled answers on the shipped model
def test_sampled_answers_of_many_seeds_are_distributed_as_without_speculation():
    """300 seeds of a sampled request with a grammar (five coloured shapes), penalties and a logit bias, with and
    without speculation: how many of the five shapes are red is one distribution (chi-square test of homogeneity,
    p > 1e-3), and speculation did accept and reject guesses along the way."""
    request = Request(prompt="Read this back: red circle, blue square, red circle, blue square, red circle.")
    params = [SamplingParams(max_tokens=32, temperature=1.0, seed=seed, frequency_penalty=0.1, presence_penalty=0.1,
                             logit_bias={89: 0.5}, structured_outputs=SO(grammar=FIVE)) for seed in range(300)]
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    counts = []
    for config in ({}, {"speculative_config": spec}):
        with Engine(EngineConfig(device="cpu", num_blocks=256, **config)) as e:
            texts = [o.text for o in e.generate([request] * len(params), params)]
            stats = e.spec_decode_stats()
        assert all(t.count(",") == 4 and t.endswith(".") for t in texts), texts[:3]
        reds = [t.count("red") for t in texts]
        counts.append([reds.count(n) for n in range(6)])
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    seen = [n for n in range(6) if counts[0][n] + counts[1][n]]
    assert len(seen) > 2
    assert chi2_contingency([[row[n] for n in seen] for row in counts]).pvalue > 1e-3, counts

"""Verification of a speculating request's guesses (vLLM's rejection sampler, for a draft that is one token per
position): the tokens it emits are distributed exactly as decoding one token at a time would give them, because each
position is judged under the distribution that token would have been sampled from: its logits shaped by the request's
logit bias, its penalties counting the guesses accepted before it, and its grammar's mask after them
(sampling/logits_shaping.shape_draft_rows)."""
import torch

from minivlm.engine.sampling.logits_shaping import shape_draft_rows
from minivlm.engine.sampling.sampler import filter_top_k_top_p


def shaping(state, masks) -> bool:
    """Whether its rows need shaping: a logit bias, penalties (a history kept) or a grammar mask in this step's."""
    return bool(state.params.logit_bias or state.history or (masks is not None and state.seq_id in masks.rows))


def verify_request(rows: torch.Tensor, draft, state, masks=None) -> list[int]:
    """The tokens a speculating request emits from its k + 1 rows of logits (raw: at its last token and at each
    guess), shaped as its sampling would shape them; state: its persistent-batch row (params, RNG, history)."""
    if shaping(state, masks):
        rows = shape_draft_rows(rows.float().clone(), state, draft, masks)
    return verify(rows, list(draft), state.params, state.generator)


def verify(logits: torch.Tensor, draft: list[int], params, generator) -> list[int]:
    """The tokens a speculating request emits: logits [k + 1, vocab] at its last token and at each draft. Greedy:
    the drafts up to the first that is not the argmax, then the argmax there (or after all k). Sampled: rejection
    sampling against a one-hot draft (a guess d is kept with probability p(d), else a token is drawn from p without
    d), then a bonus token after all k."""
    if params.temperature <= 0:
        best = logits.argmax(dim=-1).tolist()
        out = []
        for j, d in enumerate(draft):
            out.append(best[j])
            if best[j] != d:
                return out
        return out + [best[len(draft)]]
    rows = logits.float() / params.temperature
    k = rows.shape[0]
    rows = filter_top_k_top_p(rows, torch.full((k,), params.top_k), torch.full((k,), float(params.top_p)))
    probs = rows.softmax(-1).cpu()
    out = []
    for j, d in enumerate(draft):
        if torch.rand(1, generator=generator).item() < probs[j, d].item():
            out.append(d)
            continue
        residual = probs[j].clone()
        residual[d] = 0.0
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator).item()))
        return out
    return out + [int(torch.multinomial(probs[len(draft)], 1, generator=generator).item())]

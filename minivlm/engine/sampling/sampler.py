"""Token choice for a whole batch at once: greedy rows by one argmax, sampled rows by temperature + top-k + top-p
(one sort, one softmax each), each drawn with its request's own generator."""
import torch

from minivlm.engine.sampling.logits_shaping import shape_logits
from minivlm.engine.request import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, vocab]: mask each row outside its top-k (0: no limit), then outside the smallest set of tokens whose
    mass reaches its top_p (1: no limit). One sort serves both filters."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    kth = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(-1)
    drop = (probs.cumsum(-1) - probs >= top_p.unsqueeze(-1)) & (top_p < 1.0).unsqueeze(-1)  # mass before them
    drop |= sorted_logits == float("-inf")
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list,
           reqs=None, masks=None) -> tuple[list[int], torch.Tensor | None]:
    """logits [B, vocab] -> (token per row, raw log-softmax [B, vocab] for logprobs, or None if nobody asked). reqs
    (the plan's rows): their logit bias, penalties and grammar masks (masks, filled) shape the logits first (logprobs
    stay the model's own, as vLLM reports them by default)."""
    logits = logits.float()
    wanted = any(p.logprobs is not None for p in params)  # skip a [B, vocab] pass on most decode steps
    logprobs = torch.log_softmax(logits, dim=-1) if wanted else None
    if reqs is not None and (masks is not None or any(r.history or r.params.logit_bias for r in reqs)):
        logits = shape_logits(logits.clone(), reqs, masks)
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows keep this
    hot = [i for i, p in enumerate(params) if p.temperature > 0]
    if hot:
        ps = [params[i] for i in hot]
        rows = logits[torch.tensor(hot, device=logits.device)] / torch.tensor(
            [p.temperature for p in ps], device=logits.device).unsqueeze(-1)
        rows = filter_top_k_top_p(rows, torch.tensor([p.top_k for p in ps], device=logits.device),
                                  torch.tensor([p.top_p for p in ps], device=logits.device))
        probs = rows.softmax(-1).cpu()
        for j, i in enumerate(hot):
            tokens[i] = int(torch.multinomial(probs[j], 1, generator=generators[i]).item())
    return tokens, logprobs


def top_logprobs(logprobs_row: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """{token_id: logprob} for the top-k plus the sampled token (vLLM's report)."""
    out = {}
    if k > 0:
        vals, ids = torch.topk(logprobs_row, min(k, logprobs_row.shape[-1]))
        out = dict(zip(ids.tolist(), vals.tolist()))
    out[token] = float(logprobs_row[token])
    return out

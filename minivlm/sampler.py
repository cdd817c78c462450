"""Token choice per request: greedy, or temperature + top-k + top-p with a per-request generator."""
import torch

from minivlm.request import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask everything outside the top-k, then outside the smallest set of tokens whose mass reaches top_p."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep tokens until the mass before them reaches top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list) -> tuple[list[int], torch.Tensor | None]:
    """logits [B, vocab] -> (token per row, raw log-softmax [B, vocab] for logprobs, or None if nobody asked)."""
    logits = logits.float()
    wanted = any(p.logprobs is not None for p in params)  # skip a [B, vocab] pass on most decode steps
    logprobs = torch.log_softmax(logits, dim=-1) if wanted else None
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows keep this
    for i, p in enumerate(params):
        if p.temperature > 0:
            row = filter_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
            probs = row.softmax(-1)
            tokens[i] = int(torch.multinomial(probs.cpu(), 1, generator=generators[i]).item())
    return tokens, logprobs


def top_logprobs(logprobs_row: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """{token_id: logprob} for the top-k plus the sampled token (vLLM's report)."""
    out = {}
    if k > 0:
        vals, ids = torch.topk(logprobs_row, min(k, logprobs_row.shape[-1]))
        out = dict(zip(ids.tolist(), vals.tolist()))
    out[token] = float(logprobs_row[token])
    return out

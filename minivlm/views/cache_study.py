"""The A/B/C study on a live engine: a first request warms a fresh isolated pool per strategy, a second is
served from it, and each result sits next to the second request run with no cache at all. The cache
inspector panel and `python -m minivlm.experiments.mm_cache` both run it."""
from dataclasses import dataclass

from minivlm.engine.outputs import Output
from minivlm.engine.request import Request, SamplingParams


@dataclass
class StrategyResult:
    """Request 2 served under one strategy after request 1 warmed the pool, next to request 2 run cold."""
    strategy: str
    first: Output
    second: Output
    cold: Output

    @property
    def hits(self) -> int:
        return len(self.second.cache_hits)

    @property
    def false_hits(self) -> int:
        return sum(h.false_hit for h in self.second.cache_hits)

    @property
    def true_hits(self) -> int:
        return self.hits - self.false_hits

    @property
    def max_logprob_diff(self) -> float:
        return max_logprob_diff(self.second, self.cold)


def max_logprob_diff(warm: Output, cold: Output) -> float:
    """Largest |Δlogprob| over tokens both runs report, at every position up to and including the first where
    their tokens diverge (after that the two condition on different prefixes)."""
    worst = 0.0
    for i, (lw, lc) in enumerate(zip(warm.logprobs or [], cold.logprobs or [])):
        worst = max([worst] + [abs(lw[t] - lc[t]) for t in lw.keys() & lc.keys()])
        if warm.token_ids[i] != cold.token_ids[i]:
            break
    return worst


def compare_strategies(engine, first: Request, second: Request, params: SamplingParams | None = None,
                       strategies=("A", "B", "C"), num_blocks: int = 128) -> list[StrategyResult]:
    """Run first then second on a fresh isolated pool per strategy (the engine's own cache is never touched)."""
    params = params or SamplingParams(max_tokens=8, logprobs=5)
    with engine.isolated(cache_strategy="none", num_blocks=num_blocks) as cold_engine:
        cold = cold_engine.generate(second, params)
    results = []
    for strategy in strategies:
        with engine.isolated(cache_strategy=strategy, num_blocks=num_blocks) as iso:
            out1 = iso.generate(first, params)  # its blocks stay cached after it ends
            results.append(StrategyResult(strategy, out1, iso.generate(second, params), cold))
    return results

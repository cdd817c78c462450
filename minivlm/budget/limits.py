"""Why a workload does not fit, in words with its numbers: one sentence per limit it hits."""
GIB = 2 ** 30


def context_limit(est) -> str | None:
    """A request longer than max_model_len: the scheduler refuses it whatever the memory."""
    if est.needed_tokens_per_request <= est.max_model_len:
        return None
    n, markers = est.images_per_request, est.image_marker_tokens
    per_image = est.vision_tokens_per_image + markers
    around = "start/end" if markers == 2 else f"{markers} marker tokens"
    images = (f"{n} image{'s' if n != 1 else ''} × {per_image:,} tokens ({est.vision_tokens_per_image:,} vision + "
              f"{around}) + " if n else "")
    return (f"{images}{est.text_tokens_per_request:,} text tokens = {est.needed_tokens_per_request:,} tokens per "
            f"request > max_model_len {est.max_model_len:,}")


def memory_limit(est) -> str | None:
    """Weights, activation peak and overhead leave no room for a single KV block on a GPU."""
    if est.num_blocks > 0:
        return None
    fixed = est.weights_bytes + est.activation_peak_bytes + est.overhead_bytes
    gpus = f" on each of {est.tensor_parallel_size} GPUs" if est.tensor_parallel_size > 1 else ""
    return (f"weights {est.weights_bytes / GIB:.1f} GiB + activation peak {est.activation_peak_bytes / GIB:.1f} GiB"
            f" + overhead {est.overhead_bytes / GIB:.1f} GiB = {fixed / GIB:.1f} GiB{gpus} leave no room for the KV "
            f"cache in the budget of {est.budget_bytes / GIB:.1f} GiB ({est.gpu_memory_utilization} × "
            f"{est.memory_bytes / GIB:.1f} GiB)")


def kv_limit(est) -> str | None:
    """The KV pool cannot hold the workload's requests at once (each rounded up to whole blocks)."""
    if est.num_blocks == 0 or est.kv_demand_tokens <= est.kv_pool_tokens:
        return None
    per_request = est.kv_demand_tokens // est.num_seqs
    rounded = (f" ({est.needed_tokens_per_request:,} rounded up to whole {est.block_size}-token blocks)"
               if per_request != est.needed_tokens_per_request else "")
    return (f"the KV pool holds {est.kv_pool_tokens:,} tokens; {est.num_seqs:,} requests × {per_request:,} "
            f"tokens{rounded} need {est.kv_demand_tokens:,}")


def why_it_does_not_fit(est) -> list[str]:
    """Every limit the estimate's workload hits (empty when it fits)."""
    return [s for s in (context_limit(est), memory_limit(est), kv_limit(est)) if s]


def limit_names(est) -> list[str]:
    """The limits an estimate's workload hits, in one word each (for tables): context, memory, KV pool."""
    return [name for name, sentence in (("context", context_limit(est)), ("memory", memory_limit(est)),
                                        ("KV pool", kv_limit(est))) if sentence]

"""The VRAM budget's limits in the page's language, said from the estimate's numbers (the English is
minivlm.budget.limits' own sentences; tests/test_i18n.py checks the two agree)."""
from minivlm.budget.limits import GIB, context_limit, kv_limit, memory_limit

from panels.i18n import EN, t, word  # noqa: F401 (word: the VRAM tab's names)


def context_sentence(est, lang: str) -> str:
    n, markers = est.images_per_request, est.image_marker_tokens
    around = t(lang, "limit.start_end") if markers == 2 else t(lang, "limit.markers", n=markers)
    images = t(lang, "limit.context_images", n=n, s="s" if n != 1 else "",
               per_image=f"{est.vision_tokens_per_image + markers:,}", vision=f"{est.vision_tokens_per_image:,}",
               around=around) if n else ""
    return t(lang, "limit.context", images=images, text=f"{est.text_tokens_per_request:,}",
             needed=f"{est.needed_tokens_per_request:,}", limit=f"{est.max_model_len:,}")


def memory_sentence(est, lang: str) -> str:
    fixed = est.weights_bytes + est.activation_peak_bytes + est.overhead_bytes
    gpus = t(lang, "limit.memory_gpus", n=est.tensor_parallel_size) if est.tensor_parallel_size > 1 else ""
    return t(lang, "limit.memory", weights=f"{est.weights_bytes / GIB:.1f}", peak=f"{est.activation_peak_bytes / GIB:.1f}",
             overhead=f"{est.overhead_bytes / GIB:.1f}", fixed=f"{fixed / GIB:.1f}", gpus=gpus,
             budget=f"{est.budget_bytes / GIB:.1f}", util=est.gpu_memory_utilization,
             memory=f"{est.memory_bytes / GIB:.1f}")


def kv_sentence(est, lang: str) -> str:
    per_request = est.kv_demand_tokens // est.num_seqs
    rounded = (t(lang, "limit.kv_rounded", needed=f"{est.needed_tokens_per_request:,}", block_size=est.block_size)
               if per_request != est.needed_tokens_per_request else "")
    return t(lang, "limit.kv", pool=f"{est.kv_pool_tokens:,}", n=f"{est.num_seqs:,}", per_request=f"{per_request:,}",
             rounded=rounded, demand=f"{est.kv_demand_tokens:,}")


def limit_sentences(est, lang: str = EN) -> list[str]:
    """Every limit the estimate hits, in `lang` (in English: exactly est.limits)."""
    if lang == EN:
        return list(est.limits)
    checks = ((context_limit, context_sentence), (memory_limit, memory_sentence), (kv_limit, kv_sentence))
    return [say(est, lang) for hit, say in checks if hit(est)]


def limit_words(est, lang: str = EN) -> list[str]:
    """The limits in one word each (for tables), in `lang`."""
    from minivlm.budget.limits import limit_names
    return [t(lang, f"limit.name.{name}") for name in limit_names(est)]


"""The VRAM tab's words and tables: the verdict (fits, or every limit it hits; a hybrid model's requests against a
model whose every layer were full attention), the estimate against this engine, the fewest GPUs per device, and the
matrix of VLMs on common GPUs, in the page's language (pure functions)."""
import pandas as pd

from minivlm.budget.planner import MATRIX_GPUS

from panels.i18n import EN, t, word
from panels.i18n.budget import limit_sentences, limit_words

GIB = 2 ** 30
GROUP_WORDS = {"full_attention": "vram.group.full_attention", "sliding_window": "vram.group.sliding_window",
               "recurrent": "vram.group.recurrent", "kv_shared": "vram.group.kv_shared"}  # a group's layers in words


def matrix_cell(est, lang: str = EN) -> str:
    """One model on one GPU, short enough for a phone: fits (requests at once) or the limits it hits."""
    if est.fits:
        return t(lang, "vram.cell_fits", n=f"{est.workload_concurrency:,}")
    return t(lang, "vram.cell_no", limits=" + ".join(limit_words(est, lang)), n=f"{est.workload_concurrency:,}")


def matrix_table(plans, lang: str = EN) -> pd.DataFrame:
    """The matrix VLMs (rows) on one GPU of each size (columns), with each model's tokens per image."""
    rows = [(model, f"{ests[0].vision_tokens_per_image:,}" + (t(lang, "vram.tiles_cell", n=ests[0].image_tiles)
                                                               if ests[0].image_tiles > 1 else ""),
             *(matrix_cell(e, lang) for e in ests)) for model, ests in plans.items()]
    return pd.DataFrame(rows, columns=[t(lang, "col.model"), t(lang, "col.vision_tokens")]
                        + [f"{size} ({gpu})" for size, gpu in MATRIX_GPUS])


def comparison(est, rep, lang: str = EN, quantization: str | None = None) -> pd.DataFrame:
    """The estimate and the running engine side by side (`quantization`: the engine's weight-only method, named in
    its column's head: its weights figure is the quantized one)."""
    rows = [("weights", est.weights_bytes / 2**20, rep.weights_bytes / 2**20),
            ("vision", est.vision_weights_bytes / 2**20, rep.vision_weights_bytes / 2**20),
            ("kv_per_token", est.kv_bytes_per_token, rep.kv_bytes_per_token),
            ("kv_blocks", est.num_blocks, rep.num_blocks),
            ("kv_cache", est.kv_cache_bytes / 2**20, rep.kv_cache_bytes / 2**20),
            ("kv_tokens", est.num_blocks * est.block_size, rep.kv_cache_tokens),
            ("concurrency", est.max_concurrency, rep.max_concurrency),
            ("peak", None, None if rep.peak_bytes is None else rep.peak_bytes / 2**20)]
    if est.kv_groups is not None and est.kv_groups.checkpoint_bytes or rep.checkpoint_bytes:  # a recurrent model
        rows.insert(5, ("checkpoints", est.kv_groups.checkpoint_bytes / 2**20 if est.kv_groups else 0.0,
                        rep.checkpoint_bytes / 2**20))
    return pd.DataFrame([(t(lang, f"row.{k}"), _fmt(a), _fmt(b)) for k, a, b in rows],
                        columns=[t(lang, "col.quantity"), t(lang, "col.estimate"),
                                 t(lang, "col.engine", device=rep.device, dtype=engine_dtype(rep, quantization, lang))])


def breakdown_table(est, lang: str = EN) -> pd.DataFrame:
    """The estimate's rows: item (in the page's language), GiB, formula (Gemma 4's shared-KV layers: a 0 GiB row)."""
    return pd.DataFrame([(word(lang, "item", b.name), f"{b.bytes / GIB:,.3f}", b.formula) for b in est.breakdown],
                        columns=[t(lang, "col.item"), t(lang, "col.gib"), t(lang, "col.formula")])


def engine_dtype(rep, quantization: str | None, lang: str = EN) -> str:
    """The engine's dtype in words: "float32", or "int8 weights, float32 compute" under --quantization."""
    return t(lang, "vram.quantized", method=quantization, dtype=rep.dtype) if quantization else rep.dtype


def gpu_table(plans, lang: str = EN) -> pd.DataFrame:
    """The planner's answer per device: the fewest GPUs that fit, per-GPU weights, and the limit where none do."""
    rows = []
    for p in plans:
        e = p.estimate
        why = "; ".join(limit_sentences(e, lang)) if e is not None and lang != EN else p.reason
        rows.append((p.device, f"{p.gpus} × {p.device}" if p.gpus else t(lang, "vram.none_up_to"),
                     _fmt(e.weights_bytes / GIB) if e else "n/a", _fmt(e.workload_concurrency) if e else "n/a",
                     more_than_full(e), "" if p.gpus else why))
    return pd.DataFrame(rows, columns=[t(lang, f"col.{c}") for c in ("gpu", "fewest", "weights_gpu", "at_once",
                                                                      "vs_full", "why_not")])


def more_than_full(est) -> str:
    """A hybrid model's requests at once beyond a model of its dimensions whose every layer were full attention
    ("+1,234 (×4.2)"); "—" for a model that is all full attention."""
    if est is None or not est.hybrid:
        return "—"
    n, full = est.workload_concurrency, est.full_attention_concurrency
    return f"{n - full:+,}" + (f" (×{n / full:.1f})" if full else "")


def group_words(est, lang: str) -> str:
    """A hybrid model's layers by group: "6 full-attention + 18 recurrent layers" (Gemma 4: "+ 20 shared-KV layers
    (free: ...)")."""
    return " + ".join(t(lang, GROUP_WORDS[g.shape.kind], n=len(g.shape.layers), window=g.shape.window)
                      for g in est.kv_groups.groups)


def headline(est, device: str, n_seqs: int, lang: str = EN) -> str:
    """The verdict in words: blocks and concurrency, and, when it does not fit, every limit it hits."""
    gpus = t(lang, "vram.tp_note", n=est.tensor_parallel_size) if est.tensor_parallel_size > 1 else ""
    tiles = t(lang, "vram.tiles", n=est.image_tiles) if est.image_tiles > 1 else ""
    images = t(lang, "vram.text_only") if est.text_only else t(
        lang, "vram.images_line", tokens=f"{est.vision_tokens_per_image:,}", w=est.resized_image[1],
        h=est.resized_image[0], tiles=tiles)
    pool = t(lang, "vram.pool", blocks=f"{est.num_blocks:,}", tokens=f"{est.kv_pool_tokens:,}",
             concurrency=f"{est.max_concurrency:.2f}", max_len=f"{est.max_model_len:,}")
    workload = t(lang, "vram.workload", tokens=f"{est.needed_tokens_per_request:,}", images=images)
    hybrid = t(lang, "vram.hybrid", groups=group_words(est, lang), n=f"{est.workload_concurrency:,}",
               full=f"{est.full_attention_concurrency:,}", more=more_than_full(est)) if est.hybrid else ""
    if est.fits:
        return t(lang, "vram.fits", pool=pool, workload=workload, n=f"{est.workload_concurrency:,}", asked=n_seqs,
                 device=device, gpus=gpus) + hybrid
    # a verdict says one thing: what stops it, never a concurrency that the limits below contradict
    return (t(lang, "vram.no_fit", device=device, gpus=gpus, pool=pool, workload=workload, asked=n_seqs)
            + "".join(f"\n- **{limit}**" for limit in limit_sentences(est, lang)) + hybrid)


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"

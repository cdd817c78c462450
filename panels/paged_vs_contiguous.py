"""Paged vs contiguous KV, from one snapshot: a contiguous engine reserves max_model_len slots per request up front;
the paged pool holds whole blocks only as tokens arrive, wasting at most the unused tail of each last block."""
from dataclasses import dataclass

from panels.i18n import EN, t


@dataclass(frozen=True)
class PagingFigures:
    requests: int           # requests holding KV blocks
    contiguous_slots: int   # requests × max_model_len
    paged_blocks: int       # physical blocks in use (a shared block counted once)
    paged_slots: int
    tokens: int             # token slots actually filled in those blocks
    unused_slots: int       # internal fragmentation: empty slots in partly filled blocks
    shared_savings: int     # blocks that would be needed without prefix sharing, minus those in use


def paging_figures(snap, max_model_len: int) -> PagingFigures:
    used = [b for b in snap.blocks if b.ref_count > 0]
    tokens = sum(b.num_tokens for b in used)
    requests = len(snap.block_tables)
    table_entries = sum(len(t) for t in snap.block_tables.values())
    return PagingFigures(requests, requests * max_model_len, len(used), len(used) * snap.block_size, tokens,
                         len(used) * snap.block_size - tokens, table_entries - len(used))


def paging_markdown(snap, max_model_len: int, lang: str = EN) -> str:
    """One line for the KV tab, next to the map."""
    f = paging_figures(snap, max_model_len)
    if not f.requests:
        return t(lang, "kv.paging_none")
    share = f.paged_slots / f.contiguous_slots
    waste = f.unused_slots / max(1, f.paged_slots)
    shared = t(lang, "kv.paging_shared", n=f.shared_savings, s="s" if f.shared_savings != 1 else "") \
        if f.shared_savings else ""
    return t(lang, "kv.paging", requests=f.requests, max_len=f"{max_model_len:,}", slots=f"{f.contiguous_slots:,}",
             blocks=f.paged_blocks, block_size=snap.block_size, paged=f"{f.paged_slots:,}", share=f"{share:.1%}",
             tokens=f"{f.tokens:,}", unused=f.unused_slots, waste=f"{waste:.1%}", shared=shared)

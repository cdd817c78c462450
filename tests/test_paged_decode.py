"""Decode attention read in place from the paged pool (minivlm/model/backends/cpu_kernels/paged_decode.c, the CPU
backend's attention): the same numbers as plain
attention over each sequence's context in logical order, whatever the block ids, lengths and head grouping; no copy
of any context is made in a decode step; and the engine on the gather path still matches HF."""
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from minivlm import Engine, EngineConfig, SamplingParams
from minivlm.model.attention import REFERENCE, AttentionMetadata, gathered_decode
from minivlm.model.backends.cpu_kernels import PagedCpu, paged_cpu
from minivlm.model.backends.cpu_kernels.c_build import LazyKernels
from tests.test_parity import check_against_hf, requests

pytestmark = pytest.mark.skipif(paged_cpu.KERNELS.get() is None, reason=f"no kernel: {paged_cpu.KERNELS.error}")


def pool_with_contexts(lens, block_size, kv_heads, d, spare_blocks=50, seed=0):
    """A pool holding each sequence's K/V at random distinct blocks (plus unused ones), and the contexts in logical
    order."""
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in lens)
    num_blocks = len(lens) * width + spare_blocks
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, kv_heads, d, generator=g)
    ids = torch.randperm(num_blocks, generator=g)[:len(lens) * width].view(len(lens), width)
    contexts = [(k_cache[ids[i]].reshape(-1, kv_heads, d)[:n], v_cache[ids[i]].reshape(-1, kv_heads, d)[:n])
                for i, n in enumerate(lens)]
    return k_cache, v_cache, ids, contexts


def plain_attention(q, contexts, scale):
    """softmax(q K^T) V per sequence, each query head against its KV head, in float64."""
    out = []
    for qi, (k, v) in zip(q.double(), contexts):
        kv = k.shape[1]
        k, v = k.double().repeat_interleave(qi.shape[0] // kv, dim=1), v.double().repeat_interleave(qi.shape[0] // kv, dim=1)
        w = torch.einsum("hd,thd->ht", qi, k) * scale
        out.append(torch.einsum("ht,thd->hd", w.softmax(-1), v))
    return torch.stack(out).float()


@pytest.mark.parametrize("block_size,heads,kv_heads,d,lens", [
    (16, 12, 2, 64, [1, 15, 16, 17, 300, 1584]),   # the bench model's heads; partial and exact last blocks
    (5, 14, 2, 16, [3, 5, 49]),                      # odd block size, group of 7
    (8, 4, 4, 32, [9, 64]),                          # no grouping (MHA)
    (32, 16, 2, 128, [1, 31, 32, 33, 700]),          # the other head size with its own unrolled build, group of 8
    (256, 6, 3, 72, [1, 255, 256, 257, 600]),        # a head not of whole vectors; scores past a vector's width
])
def test_kernel_equals_plain_attention_over_each_context(block_size, heads, kv_heads, d, lens):
    k_cache, v_cache, tables, contexts = pool_with_contexts(lens, block_size, kv_heads, d)
    q = torch.randn(len(lens), heads + 2 * kv_heads, d)[:, :heads]  # strided rows, as the decoder slices them
    scale = d ** -0.5
    got = paged_cpu.paged_decode(q, k_cache, v_cache, tables, torch.tensor(lens), scale)
    torch.testing.assert_close(got, plain_attention(q, contexts, scale), atol=1e-5, rtol=1e-5)
    int32 = paged_cpu.paged_decode(q, k_cache, v_cache, tables.int(), torch.tensor(lens, dtype=torch.int32), scale)
    assert torch.equal(got, int32)  # block tables may come as int32 (flash-attn's dtype)
    meta = AttentionMetadata(False, torch.zeros(0, dtype=torch.long), [1] * len(lens), lens, tables,
                             torch.tensor(lens), block_size)
    torch.testing.assert_close(got, gathered_decode(q, k_cache, v_cache, meta, scale), atol=1e-5, rtol=1e-5)


def test_peaked_attention_equals_plain_attention():
    """Scores spread over hundreds (large queries): 97 % of the weights are below e^-40 of the max (they underflow
    or vanish beside it), and the few that count must still give plain attention's result."""
    lens = [40, 700]
    k_cache, v_cache, tables, contexts = pool_with_contexts(lens, 16, 2, 64, seed=3)
    q = torch.randn(len(lens), 12, 64, generator=torch.Generator().manual_seed(4)) * 40
    got = paged_cpu.paged_decode(q, k_cache, v_cache, tables, torch.tensor(lens), 64 ** -0.5)
    torch.testing.assert_close(got, plain_attention(q, contexts, 64 ** -0.5), atol=1e-5, rtol=1e-5)


def decode_step_allocations(lens, attention, block_size=16, kv_heads=2, heads=12, d=64, spare_blocks=400):
    """Bytes allocated and ops run by one layer's decode attention (write the new K/V, attend) at these lengths."""
    k_cache, v_cache, tables, _ = pool_with_contexts(lens, block_size, kv_heads, d, spare_blocks=spare_blocks)
    b = len(lens)
    q, k, v = torch.randn(b, heads, d), torch.randn(b, kv_heads, d), torch.randn(b, kv_heads, d)
    slots = torch.tensor([tables[i, (n - 1) // block_size] * block_size + (n - 1) % block_size for i, n in enumerate(lens)])
    meta = AttentionMetadata(False, slots, [1] * b, lens, tables, torch.tensor(lens), block_size)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        attention(q, k, v, k_cache, v_cache, meta, d ** -0.5)
    events = prof.key_averages()
    return sum(max(e.cpu_memory_usage, 0) for e in events), {e.key for e in events}


def test_decode_attention_copies_no_context():
    """8 sequences of 1,584 tokens: one layer's context is 13 MB of K/V. The in-place step allocates only its
    output; the gather path (the reference), measured the same way, allocates the whole padded context (so the
    measurement sees it)."""
    lens = [1584 - 7 * i for i in range(8)]
    context_bytes = 2 * sum(lens) * 2 * 64 * 4
    allocated, ops = decode_step_allocations(lens, PagedCpu())
    assert allocated < 0.01 * context_bytes, f"in-place decode allocated {allocated} bytes"
    assert "aten::index_select" not in ops and "aten::index" not in ops
    gathered, ops = decode_step_allocations(lens, REFERENCE)
    assert gathered >= context_bytes and "aten::index_select" in ops


def test_gather_path_still_matches_hf(checkpoints, monkeypatch):
    """With the kernel off (no compiler, other dtypes) the engine gathers blocks as before, and still equals HF."""
    monkeypatch.setenv("MINIVLM_PAGED_CPU", "0")
    with Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], device="cpu", num_blocks=64)) as engine:
        assert engine.attention_backend.startswith("SDPA over gathered blocks")
        reqs = requests()
        outs = engine.generate(reqs, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1))
    for request, out in zip(reqs, outs):
        check_against_hf(checkpoints["qwen2_5_vl"], "qwen2_5_vl", request, out)


@pytest.mark.parametrize("broken", ["compiler", "cache"])
def test_a_kernel_that_cannot_be_built_falls_back_and_says_why(broken, tmp_path, monkeypatch, checkpoints):
    """A compiler that fails, or a cache directory that cannot be created: decode gathers blocks, the engine serves
    and its status line names the reason (never a failed request)."""
    monkeypatch.setattr(paged_cpu, "KERNELS", LazyKernels(paged_cpu.KERNELS.source, paged_cpu.KERNELS.signatures))
    if broken == "compiler":
        monkeypatch.setenv("CC", "false")
        monkeypatch.setenv("MINIVLM_CACHE", str(tmp_path / "fresh"))  # nothing cached: it must compile
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("MINIVLM_CACHE", str(tmp_path / "file" / "cache"))
    with Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], device="cpu", num_blocks=32)) as engine:
        assert engine.attention_backend.startswith("SDPA over gathered blocks (in-place kernel: ")
        assert ("failed" if broken == "compiler" else "could not be built") in engine.attention_backend
        out = engine.generate(requests()[2], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4


def test_a_short_chunk_after_cached_tokens_reads_the_pool_in_place():
    """Chunked prefill: a chunk of 12 tokens at the end of a 1,000-token context (its K/V already written) equals
    causal attention over the context, each token over the tokens up to itself, and copies no context."""
    ctx, q_len, heads, kv_heads, d, bs = 1000, 12, 12, 2, 64, 16
    k_cache, v_cache, tables, ((k, v),) = pool_with_contexts([ctx], bs, kv_heads, d)
    q, new_kv = torch.randn(q_len, heads, d), torch.zeros(q_len, kv_heads, d)  # its K/V are in the pool already
    meta = AttentionMetadata(True, torch.zeros(0, dtype=torch.long), [q_len], [ctx], tables, torch.tensor([ctx]), bs)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        got = PagedCpu().prefill(q, new_kv, new_kv, k_cache, v_cache, meta, d ** -0.5)
    want = torch.cat([plain_attention(q[r:r + 1], [(k[:ctx - q_len + r + 1], v[:ctx - q_len + r + 1])], d ** -0.5)
                      for r in range(q_len)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    events = prof.key_averages()
    assert "aten::index_select" not in {e.key for e in events}
    assert sum(max(e.cpu_memory_usage, 0) for e in events) < 0.1 * 2 * ctx * kv_heads * d * 4  # its output, lengths


def test_a_mixed_step_is_one_in_place_call(monkeypatch):
    """Two decodes and a 12-token chunk in one step: one kernel call over all 14 tokens (no per-part path), equal to
    the gather path's SDPA on the same pool."""
    lens, q_lens, heads, kv_heads, d, bs = [50, 300, 500], [1, 1, 12], 12, 2, 64, 16
    k_cache, v_cache, tables, _ = pool_with_contexts(lens, bs, kv_heads, d)
    T = sum(q_lens)
    q, k, v = torch.randn(T, heads, d), torch.randn(T, kv_heads, d), torch.randn(T, kv_heads, d)
    pos = [p for n, c in zip(q_lens, lens) for p in range(c - n, c)]
    row = [i for i, n in enumerate(q_lens) for _ in range(n)]
    slots = torch.tensor([tables[i, p // bs] * bs + p % bs for i, p in zip(row, pos)])

    def run(attention):
        meta = AttentionMetadata.build(slots, q_lens, lens, tables, bs, "cpu", attention)
        return meta.attention(q, k, v, k_cache.clone(), v_cache.clone(), meta, d ** -0.5)
    calls = []
    real = paged_cpu.paged_decode
    monkeypatch.setattr(paged_cpu, "paged_decode", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    got = run(PagedCpu())
    assert calls == [T]
    torch.testing.assert_close(got, run(REFERENCE), atol=1e-5, rtol=1e-5)

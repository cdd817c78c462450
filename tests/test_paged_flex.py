"""FlexAttention over the paged pool (minivlm/model/backends/paged_flex.py, the flex backend), the in-place path
for CUDA at any block size, checked here on the CPU, where inductor compiles the same code: the same numbers as
plain attention and the C kernel (partial and exact last blocks, shared blocks, grouped heads, padded queries); an
engine on it equals HF and copies no context; it serves by gathering while it compiles; a compiled kernel that
disagrees on first use is dropped."""
import threading
import weakref

import pytest
import torch

from minivlm import Engine, EngineConfig, SamplingParams
from minivlm.model.backends import paged_flex
from minivlm.model.backends.cpu_kernels import paged_cpu
from minivlm.model.backends.flex import FlexAttention
from tests.test_paged_decode import decode_step_allocations, plain_attention, pool_with_contexts
from tests.test_parity import check_against_hf, requests


@pytest.fixture(autouse=True)
def flex_serves_the_cpu(monkeypatch):
    monkeypatch.setattr(paged_flex, "DEVICES", {"cpu"})


@pytest.mark.parametrize("block_size,heads,kv_heads,d,lens", [
    (16, 12, 2, 64, [1, 15, 16, 17, 300, 1584]),  # the bench model's heads; partial and exact last blocks
    (8, 4, 4, 32, [9, 64, 1]),                     # no grouping (MHA), another block size
])
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_compiled_flex_equals_plain_attention_and_the_c_kernel(block_size, heads, kv_heads, d, lens):
    k_cache, v_cache, tables, contexts = pool_with_contexts(lens, block_size, kv_heads, d)
    tables[1, :1] = tables[0, :1]  # a prefix block two sequences share (the prefix cache)
    contexts[1] = (k_cache[tables[1]].reshape(-1, kv_heads, d)[:lens[1]], v_cache[tables[1]].reshape(-1, kv_heads, d)[:lens[1]])
    q = torch.randn(len(lens), heads + 2 * kv_heads, d)[:, :heads]  # strided rows, as the decoder slices them
    scale = d ** -0.5
    assert paged_flex.warm(k_cache, v_cache, heads, scale, len(lens), block_size) == "ready"
    assert paged_flex.ready(q, k_cache) and not paged_flex.ready(torch.zeros(600, heads, d), k_cache)  # > buckets
    got = paged_flex.paged_attention(q, k_cache, v_cache, tables, torch.tensor(lens), scale)
    torch.testing.assert_close(got, plain_attention(q, contexts, scale), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, paged_cpu.paged_decode(q, k_cache, v_cache, tables, torch.tensor(lens), scale),
                               atol=1e-5, rtol=1e-5)
    mask = paged_flex.block_mask(tables, torch.tensor(lens), k_cache.shape[0], block_size, 16)
    unfused = paged_flex.attend(q, k_cache, v_cache, mask, scale, compiled=False)  # the mask function alone
    torch.testing.assert_close(unfused, got, atol=1e-5, rtol=1e-5)


def test_a_compiled_kernel_that_disagrees_on_first_use_is_dropped(monkeypatch):
    """The first real call of each bucket is also computed by gathering: a wrong result is never returned, and the
    bucket goes back to gathering for good (the status line says why)."""
    lens = [20, 33] + list(range(1, 19))  # 20 queries: past the 16 the first call compares, in bucket 32
    k_cache, v_cache, tables, contexts = pool_with_contexts(lens, 16, 2, 16, spare_blocks=7)
    q = torch.randn(len(lens), 4, 16)
    assert paged_flex.warm(k_cache, v_cache, 4, 0.25, len(lens), 16) == "ready"
    real = paged_flex.attend
    monkeypatch.setattr(paged_flex, "attend", lambda *a, **k: real(*a, **k) + 0.5)  # a miscompiled kernel
    got = paged_flex.paged_attention(q, k_cache, v_cache, tables, torch.tensor(lens), 0.25)
    torch.testing.assert_close(got, plain_attention(q, contexts, 0.25), atol=1e-5, rtol=1e-5)
    assert not paged_flex.ready(q, k_cache)
    assert paged_flex.status[paged_flex.pool_key(k_cache, 4)].startswith("failed: 32 queries differ by 5.00e-01")


@pytest.fixture
def flex_on_cpu(monkeypatch):
    """The engine as on CUDA: no C attention kernel, FlexAttention for the in-place reads."""
    monkeypatch.setenv("MINIVLM_PAGED_CPU", "0")


def test_an_engine_on_flex_attention_serves_while_compiling_then_matches_hf(checkpoints, flex_on_cpu, monkeypatch):
    calls = []
    real = paged_flex.paged_attention
    monkeypatch.setattr(paged_flex, "paged_attention", lambda q, *a, **k: (calls.append(q.shape[0]), real(q, *a, **k))[1])
    gate = threading.Event()
    warm = paged_flex.warm
    monkeypatch.setattr(paged_flex, "warm", lambda *a: (gate.wait(60), warm(*a))[1])  # compiling until the gate opens
    with Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], device="cpu", num_blocks=64, max_num_seqs=4)) as engine:
        assert engine.attention_backend == "SDPA over gathered blocks (FlexAttention in place: compiling)"
        first = engine.generate(requests()[2], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(first.token_ids) == 4 and not calls  # served, by gathering
        gate.set()
        engine.core.runner.backend.attention.warmup.join()
        assert engine.attention_backend.startswith("in-place paged decode (FlexAttention over the block tables")
        reqs = requests()
        outs = engine.generate(reqs, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1))
    assert calls and max(calls) <= 16  # every decode step (and no step past the warmed bucket)
    for request, out in zip(reqs, outs):
        check_against_hf(checkpoints["qwen2_5_vl"], "qwen2_5_vl", request, out)


def test_flex_decode_attention_copies_no_context(flex_on_cpu):
    """8 sequences of 1,584 tokens (13 MB of K/V a layer): the flex step allocates its block mask (queries x pool
    blocks) and its output, and more context adds only block ids (8 bytes where the gather copies 16 KB); the
    gather path, measured the same way, allocates the whole context."""
    lens, short = [1584 - 7 * i for i in range(8)], [100 - 7 * i for i in range(8)]
    context_bytes = 2 * sum(lens) * 2 * 64 * 4
    k_cache, v_cache, _, _ = pool_with_contexts(lens, 16, 2, 64, spare_blocks=400)  # decode_step_allocations' pool
    assert paged_flex.warm(k_cache, v_cache, 12, 0.125, 8, 16) == "ready"
    flex = FlexAttention()
    decode_step_allocations(lens, flex)  # the bucket's first call, checked by gathering once
    allocated, ops = decode_step_allocations(lens, flex)
    same_pool = k_cache.shape[0] - 8 * 7  # spare blocks that give the short contexts (7 blocks each) this pool
    shorter = decode_step_allocations(short, flex, spare_blocks=same_pool)[0]
    assert 0 <= allocated - shorter < 0.01 * (context_bytes - 2 * sum(short) * 2 * 64 * 4)  # block ids, not K/V
    assert allocated < 0.1 * context_bytes and "aten::index_select" not in ops
    paged_flex._ready.clear()
    gathered, ops = decode_step_allocations(lens, flex)  # no bucket compiled: the step gathers
    assert gathered >= context_bytes and "aten::index_select" in ops
    assert not flex.ready(torch.zeros(8, 12, 64), k_cache)


def test_closing_an_engine_stops_its_compile_and_frees_the_pool(checkpoints, flex_on_cpu):
    """The compile thread holds the pool while it runs: close() stops it after its current bucket and waits, so
    the pool's memory goes back at close (on a GPU, what gpu_check's memory part measures)."""
    engine = Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], device="cpu", num_blocks=64, max_num_seqs=4,
                                 enable_chunked_prefill=True))  # up to 64 queries a call: three buckets to compile
    pool, key = weakref.ref(engine.core.pool.kv_cache), engine.core.runner.backend.attention.key
    engine.close()
    assert not engine.core.runner.backend.attention.warmup.is_alive()
    assert paged_flex.status[key].startswith("stopped after ") and paged_flex.status[key].endswith("of 3: the engine closed")
    assert engine.attention_backend.startswith("SDPA over gathered blocks (FlexAttention in place: stopped after")
    assert pool() is None

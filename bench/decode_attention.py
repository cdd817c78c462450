"""python -m bench.decode_attention: one layer's decode attention at long context (8 sequences x 1,584 tokens, the
bench model's 12 query / 2 KV heads of 64, blocks of 16 scattered over the pool), three ways: the in-place kernel
(model/backends/cpu_kernels/paged_decode.c), gathering each context and SDPA (the fallback), and FlexAttention over the paged pool with
a block mask built from the block tables (eager: PyTorch runs it unfused on the CPU). Prints ms per call, the K/V
bytes each reads per call, and the effective bandwidth."""
import argparse
import statistics
import time

import torch

from minivlm.model.attention import AttentionMetadata, gathered_decode
from minivlm.model.backends.cpu_kernels import paged_cpu
from bench.timing import copy_bandwidth


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def flex_paged(q, k_cache, v_cache, tables, lens, scale):
    """FlexAttention over the whole pool as one KV sequence; the block mask lists each sequence's physical blocks
    (the block table), and mask_mod maps a physical slot back to its logical position to mask the tail."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    num_blocks, bs, kv_heads, d = k_cache.shape
    b, width = tables.shape
    kv_idx = torch.zeros(b, 1, 1, num_blocks, dtype=torch.int32)
    kv_idx[..., :width] = tables.to(torch.int32)[:, None, None]
    logical = torch.full((b, num_blocks), -1, dtype=torch.long).scatter_(1, tables, torch.arange(width).expand(b, -1))

    def mask_mod(bi, h, qi, kv):
        page = logical[bi, kv // bs]
        return (page >= 0) & (page * bs + kv % bs < lens[bi])
    mask = BlockMask.from_kv_blocks(torch.full((b, 1, 1), width, dtype=torch.int32), kv_idx, BLOCK_SIZE=(1, bs),
                                    mask_mod=mask_mod, seq_lengths=(1, num_blocks * bs))
    pool_k = k_cache.view(1, -1, kv_heads, d).transpose(1, 2).expand(b, -1, -1, -1)
    pool_v = v_cache.view(1, -1, kv_heads, d).transpose(1, 2).expand(b, -1, -1, -1)
    return lambda: flex_attention(q[:, :, None], pool_k, pool_v, block_mask=mask, scale=scale, enable_gqa=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--flex", action="store_true", help="also time eager FlexAttention (seconds per call)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, heads, kv_heads, d, bs, num_blocks = 8, 12, 2, 64, 16, 1200
    lens = torch.tensor([1584 - 7 * i for i in range(b)])
    width = -(-int(lens.max()) // bs)
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(2, num_blocks, bs, kv_heads, d, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[:b * width].view(b, width)
    q, scale = torch.randn(b, heads, d, generator=g), d ** -0.5
    meta = AttentionMetadata(False, torch.zeros(0, dtype=torch.long), [1] * b, lens.tolist(), tables, lens, bs)
    held = int(lens.sum()) * kv_heads * d * 4 * 2
    padded = b * width * bs * kv_heads * d * 4 * 2
    ways = {"gather + SDPA": (lambda: gathered_decode(q, k_cache, v_cache, meta, scale), 3 * padded)}
    if paged_cpu.KERNELS.get() is not None:
        ways["in place (paged_decode.c)"] = (lambda: paged_cpu.paged_decode(q, k_cache, v_cache, tables, lens, scale),
                                             held)
    if args.flex:
        ways["FlexAttention, eager"] = (flex_paged(q, k_cache, v_cache, tables, lens, scale), 2 * num_blocks * bs *
                                        kv_heads * d * 4)  # unfused: it scores the whole pool
    bw = copy_bandwidth()
    print(f"{b} x {int(lens.max())} tokens, K/V held {held / 1e6:.1f} MB, copy bandwidth {bw / 1e9:.1f} GB/s, "
          f"{args.threads} threads")
    for name, (fn, nbytes) in ways.items():
        s = timed(fn, args.repeats if "Flex" not in name else 2)
        print(f"{name:28s} {s * 1e3:8.2f} ms  reads+writes {nbytes / 1e6:6.1f} MB  {nbytes / s / 1e9:5.1f} GB/s")


if __name__ == "__main__":
    main()

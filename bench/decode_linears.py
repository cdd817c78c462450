"""python -m bench.decode_linears: the bench model's 32 decoder matrix products of one decode step (8 layers of
qkv 1024x768, o 768x768, gate/up 5120x768, down 768x2560; 230 MB of fp32 weights) for 1 to 16 rows, four ways,
interleaved so machine noise lands on each alike: gemv.c (model/backends/cpu_kernels/gemv.c, dense weights; on an AVX-512 CPU also its
8-wide AVX2 tile, built with GEMV_NO_512), oneDNN with prepacked
weights (what FastLinear ran before), oneDNN on dense weights, and MKL (F.linear). Prints the fastest of the
repeats in ms and the weight bytes read per second, beside a plain read of the same bytes (torch.sum)."""
import argparse
import time

import torch
import torch.nn.functional as F

from minivlm.model.backends.cpu_kernels import gemv


def has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512f" in f.read()
    except OSError:  # not Linux: the default build's tile is the only one
        return False


SHAPES = [(1024, 768), (768, 768), (5120, 768), (768, 2560)] * 8


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if gemv.KERNELS.get() is None:
        raise SystemExit(f"gemv.c is not available here: {gemv.KERNELS.error}")
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g) for o, i in SHAPES]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
    narrow = gemv.kernel_variant("GEMV_NO_512") if has_avx512() else None
    nbytes = sum(w.numel() * 4 for w in weights)
    print(f"{len(weights)} matrices, {nbytes / 1e6:.0f} MB fp32, {args.threads} threads; fastest of {args.repeats}")
    for rows in args.rows:
        x = {i: torch.randn(rows, i, generator=g) for i in (768, 2560)}
        ways = {"gemv.c": lambda: [gemv.linear(x[w.shape[1]], w, None) for w in weights],
                **({"gemv.c 8-wide": lambda: [gemv.linear(x[w.shape[1]], w, None, narrow) for w in weights]}
                   if narrow else {}),
                "oneDNN packed": lambda: [torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [], "")
                                          for w, p in zip(weights, packed)],
                "oneDNN dense": lambda: [torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], w, None, "none", [], "")
                                         for w in weights],
                "MKL": lambda: [F.linear(x[w.shape[1]], w) for w in weights],
                "read (sum)": lambda: [w.sum() for w in weights]}
        got = gemv.linear(x[768], weights[2], None)
        assert torch.allclose(got, F.linear(x[768], weights[2]), rtol=1e-4, atol=1e-3)
        assert narrow is None or torch.allclose(gemv.linear(x[768], weights[2], None, narrow), got, rtol=1e-4,
                                                atol=1e-3)
        best = {k: float("inf") for k in ways}
        for fn in ways.values():
            fn()  # warm: first-call setup is not what a decode step pays
        for _ in range(args.repeats):
            for k, fn in ways.items():
                t = time.perf_counter()
                fn()
                best[k] = min(best[k], time.perf_counter() - t)
        print(f"rows {rows:>2}: " + "  ".join(f"{k} {1e3 * s:.2f} ms ({nbytes / s / 1e9:.1f} GB/s)"
                                              for k, s in best.items()))


if __name__ == "__main__":
    main()

"""python -m bench.quantized_linears: the maintained int4 / int8 decode kernels against the engine's, out of cache
(issue #57 step 1). The decoder matrices of the ~340M peer model (workload.PEER_MODEL: qkv 1536x1024, o 1024x1024,
gate and up 3072x1024, down 1024x3072 a layer; --layers of them, distinct, so the weights do not fit the CPU cache),
one decode row (M=1) through each, interleaved so machine noise lands on each alike; prints the fastest sweep of the
repeats as GB/s of weight bytes read (each way's own bytes: int4 ones half of int8's) and the token time it implies
(ms for the sweep). Candidates that do not run on this CPU say why instead of a figure.

int4: PyTorch's `_weight_int4pack_mm_for_cpu` (bf16 rows; the engine's Int4Linear), gemv_int4.c (the engine's
hand-written int4 x Q8 tiles of its one-call decode step: fp32 rows quantized to int8 blocks inside), PyTorch's
`_dyn_quant_matmul_4bit` (int8 rows x int4; KleidiAI on ARM, a reference loop elsewhere), torchao's CPU configs
(Int4WeightOnlyConfig, Int8DynamicActivationIntxWeightConfig) where `torchao` imports, the engine's
Int4Linear as a decode step calls it (`minivlm.model.backends.quantized`).
int8: fbgemm's dynamic int8 linear (int8 rows x int8 weights, `torch.ops.quantized.linear_dynamic`, what
`torch.ao.quantization.quantize_dynamic` runs), PyTorch's `_weight_int8pack_mm` (bf16 rows), gemv_int8.c (the
engine's hand-written kernel, fp32 rows quantized to int8 blocks inside), torchao's Int8DynamicActivationInt8Weight.
A read of the same bytes (`sum`) is the ceiling."""
import argparse
import time

import torch
from torch import nn

from minivlm.model.backends import quantized
from minivlm.model.backends.cpu_kernels import gemv_int4, gemv_int8

from bench.workload import PEER_MODEL


def shapes(layers: int) -> list[tuple[int, int]]:
    m = PEER_MODEL
    hidden, q, kv = m["hidden"], m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    inter = m["intermediate"]
    return [(q + 2 * kv, hidden), (hidden, q), (inter, hidden), (inter, hidden), (hidden, inter)] * layers


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def int4_candidates(linears):
    """name -> (make: linear -> (call(x_fp32) -> y, bytes)) for int4."""
    def engine(lin):
        q = quantized.Int4Linear(lin, torch.float32)
        return q, nbytes(q.qweight, q.scales_zeros)

    def raw(lin):  # the kernel alone, its input already bf16 (no kernel_input copy)
        q = quantized.Int4Linear(lin, torch.float32)
        xb = torch.randn(1, lin.in_features).to(torch.bfloat16)
        return (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, q.qweight, q.group, q.scales_zeros),
                nbytes(q.qweight, q.scales_zeros))

    def dyn_quant(lin, group=32):
        n, k = lin.weight.shape
        w = torch.randint(0, 16, (n, k), dtype=torch.int32)
        packed = torch.ops.aten._dyn_quant_pack_4bit_weight(((w[:, 1::2] << 4) | w[:, ::2]).to(torch.uint8),
                                                            torch.rand(n, k // group), None, group, k, n)
        return (lambda x: torch.ops.aten._dyn_quant_matmul_4bit(x, packed, group, k, n), n * k // 2)
    def c_int4(lin):  # the engine's int4 x Q8 tiles (int4_weights.h), the same quantized weights as Int4Linear's
        q = quantized.Int4Linear(lin, torch.float32)
        return (lambda x: gemv_int4.linear(x, q.c_nibbles, q.c_sm, q.group), nbytes(q.c_nibbles, q.c_sm))
    out = {"torch int4pack (engine Int4Linear)": engine, "torch int4pack kernel alone": raw}
    if gemv_int4.KERNELS.get() is not None:
        out[f"gemv_int4.c (engine, q8 rows, {gemv_int4.path()})"] = c_int4
    return {**out, "torch _dyn_quant_matmul_4bit": dyn_quant, **torchao_candidates(4)}


def int8_candidates(linears):
    def fbgemm(lin):
        w = lin.weight.detach()
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
        # a deprecated API (it warns), still the way into fbgemm's packed weights
        qw = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0,
                                        torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, None)
        return (lambda x: torch.ops.quantized.linear_dynamic(x, packed, True), w.numel() + 8 * w.shape[0])

    def int8pack(lin):
        q = quantized.Int8Linear(lin, torch.float32)
        xb = torch.randn(1, lin.in_features).to(torch.bfloat16)
        return (lambda x: torch.ops.aten._weight_int8pack_mm(xb, q.qweight, q.scales), nbytes(q.qweight, q.scales))

    def gemv(lin):
        q = quantized.Int8Linear(lin, torch.float32)
        return (lambda x: gemv_int8.linear(x, q.qweight, q.scales_f32, None), nbytes(q.qweight, q.scales_f32))
    out = {"fbgemm dynamic int8 (quantize_dynamic)": fbgemm, "torch _weight_int8pack_mm": int8pack}
    if gemv_int8.KERNELS.get() is not None:
        out["gemv_int8.c (engine)" + (", q8 rows" if gemv_int8.q8_activations() else "")] = gemv
    return {**out, **torchao_candidates(8)}


def torchao_candidates(bits: int) -> dict:
    try:
        import torchao  # noqa: F401
        from torchao.quantization import (Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                          Int8DynamicActivationIntxWeightConfig, quantize_)
        from torchao.quantization.granularity import PerGroup
    except Exception as e:  # absent, or not importable against this torch
        return {f"torchao (int{bits})": lambda lin, e=e: (_ for _ in ()).throw(RuntimeError(f"no torchao: {e}"))}
    if bits == 4:
        configs = {f"torchao Int4WeightOnly {fmt}": lambda fmt=fmt: Int4WeightOnlyConfig(
            group_size=128, int4_packing_format=fmt) for fmt in ("plain", "plain_int32", "tile_packed_to_4d")}
        configs.update({f"torchao Int8DynActIntxWeight int4 {fmt}": lambda fmt=fmt: Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(32), intx_packing_format=fmt)
            for fmt in ("opaque_aten_kleidiai", "opaque_torchao_auto", "unpacked_to_int8")})
    else:
        configs = {"torchao Int8DynActInt8Weight": Int8DynamicActivationInt8WeightConfig}

    def make(config):
        def build(lin):
            q = nn.Linear(lin.in_features, lin.out_features, bias=False)
            q.weight.data.copy_(lin.weight)
            quantize_(q, config())
            return q, (lin.weight.numel() * bits) // 8
        return build
    return {name: make(c) for name, c in configs.items()}


def sweep(calls, xs) -> float:
    t = time.perf_counter()
    for call, x in zip(calls, xs):
        call(x)
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12, help="PEER_MODEL layers of distinct matrices (default 12)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slow", type=float, default=20.0,
                    help="drop a way whose first product takes this many times a read of its fp32 weight")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    linears = []
    for o, i in shapes(args.layers):
        lin = nn.Linear(i, o, bias=False)
        lin.weight.data = torch.randn(o, i, generator=g) * 0.02
        linears.append(lin)
    xs = [torch.randn(1, lin.in_features, generator=g) for lin in linears]
    flags = sorted(f for f in open("/proc/cpuinfo").read().split() if f.startswith(("avx512_vnni", "avx_vnni",
                   "amx", "avx512_bf16", "avx512f", "avx2"))) if __import__("os").path.exists("/proc/cpuinfo") else []
    print(f"{len(linears)} matrices ({sum(lin.weight.numel() for lin in linears) / 1e6:.0f}M weights), one row, "
          f"{args.threads} threads, fastest of {args.repeats}; torch {torch.__version__}, "
          f"capability {torch.backends.cpu.get_cpu_capability()}, flags {' '.join(sorted(set(flags)))}")
    w0 = linears[0].weight.detach()
    read_one = min(sweep([lambda x: w0.sum()], xs[:1]) for _ in range(4))
    for bits, cands in ((4, int4_candidates(linears)), (8, int8_candidates(linears))):
        ways, sizes = {}, {}
        for name, make in cands.items():
            try:
                first = make(linears[0])
                call = first[0]
                one = min(sweep([call], xs[:1]) for _ in range(4))
                if one > args.slow * read_one:
                    raise RuntimeError(f"{1e3 * one:.1f} ms for one product, {one / read_one:.0f}x a read of its "
                                       f"fp32 weight (a reference loop)")
                built = [first] + [make(lin) for lin in linears[1:]]
                ways[name], sizes[name] = [b[0] for b in built], sum(b[1] for b in built)
            except Exception as e:  # noqa: BLE001 - each candidate's own refusal is the finding
                print(f"  int{bits} {name}: does not run here: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
        if not ways:
            continue
        plain = [lin.weight.detach().to(torch.int8 if bits == 8 else torch.uint8)[:, : (lin.in_features * bits) // 8]
                 .contiguous() for lin in linears]
        ways["read (sum)"], sizes["read (sum)"] = [lambda x, p=p: p.view(torch.float32).sum() for p in plain], \
            nbytes(*plain)
        best = {k: float("inf") for k in ways}
        with torch.inference_mode():
            for calls in ways.values():
                sweep(calls, xs)
            for _ in range(args.repeats):
                for k, calls in ways.items():
                    best[k] = min(best[k], sweep(calls, xs))
        for k, s in best.items():
            print(f"  int{bits} {k}: {sizes[k] / s / 1e9:.1f} GB/s ({sizes[k] / 1e6:.0f} MB in {1e3 * s:.2f} ms)")


if __name__ == "__main__":
    main()

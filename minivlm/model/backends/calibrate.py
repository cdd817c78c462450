"""The CPU step, chosen at load by a few timed decode steps of this model on this CPU (fp32 here; int8 and bf16 weights
below): the C kernels (decode_layer.c / decode_ops.c with gemv.c), or PyTorch's own ops with oneDNN's prepacked
linears, or PyTorch's ops with plain nn.Linear (MKL), as HF runs. The C kernels were tuned on one AMD Zen 5; on an
Intel Xeon with AMX they ran 0.71x HF `generate` (issue #44), where MKL and oneDNN are tuned for the CPU: the engine
should never be slower than PyTorch is on its CPU, so it measures instead of assuming. A candidate replaces the C step
only if it is faster by MARGIN (the C step is the tested default; a calibration is a few steps on a machine that may
be busy). A small model is not timed: its step is overhead, where the C step's one call beats hundreds of ops by far.

The timed steps decode one token at CONTEXT over blocks 0.. of the pool, which is empty at load: what they write
there is never read, since every request writes its K/V before attending to them."""
import os
import time

import torch

from minivlm.model.attention import AttentionMetadata
from minivlm.model.backends.base import Backend, Said
from minivlm.model.backends.cpu_kernels import linears

CONTEXT = 64     # tokens of context in a timed step (a short chat's decode)
WARM, TIMED = 1, 3
MARGIN = 1.15    # another step must be this much faster than the C step to replace it
MIN_BYTES = 64 * 2**20  # fp32 linear weights below this: a step is overhead, which the C step's few calls win
SWITCH = "MINIVLM_CALIBRATE"  # 0: keep the C step without timing


def step_seconds(backend, decoder, kv_caches, block_size: int) -> float:
    """Median seconds of one decode step (one sequence, CONTEXT tokens) through backend."""
    blocks = torch.arange(-(-CONTEXT // block_size))[None]
    meta = AttentionMetadata.build(torch.tensor([CONTEXT - 1]), [1], [CONTEXT], blocks, block_size, "cpu",
                                   backend.attention)
    embeds = decoder.embed_tokens(torch.tensor([0]))
    positions, last = torch.full((3, 1), CONTEXT - 1), torch.tensor([0])
    times = []
    with torch.inference_mode():
        for i in range(WARM + TIMED):
            t = time.perf_counter()
            backend.forward(decoder, embeds, positions, kv_caches, meta, None, last)
            if i >= WARM:
                times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def choose(kernels: Backend, decoder, kv_caches, block_size: int, timer=step_seconds) -> Backend:
    """The fastest of the C step and PyTorch's (oneDNN, then MKL linears) on this CPU; its `calibration` says the
    times (the status line shows them after the decode path).
    Choosing MKL turns the decoder's linears into plain ones (their packed copies freed)."""
    if os.environ.get(SWITCH, "1") == "0":
        return kernels
    weights = sum(m.weight.numel() * 4 for m in decoder.modules() if isinstance(m, torch.nn.Linear))
    if weights < MIN_BYTES:  # untimed: its calibration stays "" (the status line says nothing of it)
        return kernels
    torch_ops = Backend(kernels.attention, Said("engine.decode_torch", why=Said("engine.calibrated_onednn")))
    times = {"c": timer(kernels, decoder, kv_caches, block_size),
             "onednn": timer(torch_ops, decoder, kv_caches, block_size)}
    plain = linears.plain_ready(decoder)
    if plain:
        linears.set_plain(decoder, True)
        times["mkl"] = timer(torch_ops, decoder, kv_caches, block_size)
        linears.set_plain(decoder, False)
    best = min(times, key=times.get)
    if times["c"] <= MARGIN * times[best]:
        best = "c"
    ms = {k: f"{v * 1e3:.2f}" for k, v in times.items()}
    said = Said("engine.decode_calibrated", c=ms["c"], onednn=ms["onednn"],
                mkl=Said("engine.calibrated_mkl_ms", ms=ms["mkl"]) if "mkl" in ms else "")
    chosen = kernels if best == "c" else torch_ops
    if best == "mkl":
        linears.set_plain(decoder, True, free_packed=True)
        torch_ops.decode = Said("engine.decode_torch", why=Said("engine.calibrated_mkl"))
    chosen.calibration = said
    return chosen


def choose_int8(kernels: Backend, decoder, kv_caches, block_size: int, timer=step_seconds) -> Backend:
    """Quantized int8 weights in an fp32 engine: the C step over them (decode_layer_int8.c in one call, or gemv_int8.c
    layer by layer where that is off) or the fused ops layer by layer around PyTorch's int8 kernel, whichever a timed
    step says is faster by MARGIN; the backend's `calibration` says the times."""
    from minivlm.model.backends.cpu_kernels import gemv, gemv_int8
    from minivlm.model.backends.quantized import Int8Linear
    if os.environ.get(SWITCH, "1") == "0" or gemv_int8.KERNELS.get() is None:
        return kernels
    layers = [m for m in decoder.modules() if isinstance(m, Int8Linear)]

    def use(rows: int):  # decode rows of the layer-by-layer path: gemv_int8.c (MAX_ROWS) or PyTorch's kernel (0)
        for m in layers:
            m.small_rows = rows
    use(gemv.MAX_ROWS)
    if sum(m.qweight.numel() for m in layers) * 4 < MIN_BYTES:  # untimed, as choose(): a small model's step is
        return kernels  # overhead, which the one call wins by far (timed, a busy machine's noise could pick either)
    ours = timer(kernels, decoder, kv_caches, block_size)
    theirs_backend = kernels.layer_by_layer(Said("engine.calibrated_torch_int8"))
    use(0)
    theirs = timer(theirs_backend, decoder, kv_caches, block_size)
    chosen = kernels if ours <= MARGIN * theirs else theirs_backend
    use(gemv.MAX_ROWS if chosen is kernels else 0)
    chosen.calibration = Said("engine.calibrated_int8", gemv=f"{ours * 1e3:.2f}", torch=f"{theirs * 1e3:.2f}")
    return chosen


def choose_bf16(kernels: Backend, decoder, kv_caches, block_size: int, timer=step_seconds) -> Backend:
    """A bf16 engine on the CPU: the C step over bf16 weights (bf16_step.py) or PyTorch's bf16 ops (fast where the CPU
    has native bf16: AMX, AVX512-BF16), whichever a timed step says is faster by MARGIN; `calibration` says the
    times."""
    if os.environ.get(SWITCH, "1") == "0":
        return kernels
    weights = sum(4 * (m.qweight if hasattr(m, "qweight") else m.weight).numel() for m in decoder.modules()
                  if isinstance(m, torch.nn.Linear) or hasattr(m, "qweight"))  # int8 ones counted as fp32 ones
    if weights < MIN_BYTES:  # untimed, as choose()
        return kernels
    torch_ops = Backend(kernels.attention, Said("engine.decode_torch", why=Said("engine.calibrated_torch_bf16")))
    ours, theirs = (timer(b, decoder, kv_caches, block_size) for b in (kernels, torch_ops))
    chosen = kernels if ours <= MARGIN * theirs else torch_ops
    chosen.calibration = Said("engine.calibrated_bf16", weights=kernels.weights, c=f"{ours * 1e3:.2f}",
                              torch=f"{theirs * 1e3:.2f}")
    return chosen

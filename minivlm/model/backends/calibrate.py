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


ROWS_TOLERANCE = 0.1  # nats: the largest |Δ logprob| over the exact path's top ROWS_TOP tokens that an int8 rows
ROWS_TOP = 8           # kernel may add to the timed step's logits (PyTorch's kernel, bf16 inputs, is the exact one),
ROWS_FACTOR = 1.5      # or this many times gemv_int8.c's (its rows in blocks of 32: llama.cpp's Q8_0 activations,
# the engine's reference for int8 accuracy, kept whatever its error)


def step_logits(backend, decoder, kv_caches, block_size: int) -> torch.Tensor:
    """The log-probabilities of the timed step (step_seconds' input) through backend."""
    blocks = torch.arange(-(-CONTEXT // block_size))[None]
    meta = AttentionMetadata.build(torch.tensor([CONTEXT - 1]), [1], [CONTEXT], blocks, block_size, "cpu",
                                   backend.attention)
    with torch.inference_mode():
        logits = backend.forward(decoder, decoder.embed_tokens(torch.tensor([0])), torch.full((3, 1), CONTEXT - 1),
                                 kv_caches, meta, None, torch.tensor([0]))
    return torch.log_softmax(logits.float().reshape(-1), -1)


def use_rows(layers, rows: int, kernel=None) -> None:
    """The int8 layers' decode rows (Int8Linear.small_rows) and the kernel that takes them (int8_rows.py)."""
    from minivlm.model.backends import int8_rows
    for m in layers:
        m.small_rows, m.rows_kernel = rows, kernel or int8_rows.GEMV


def time_rows(layers, backend, decoder, kv_caches, block_size: int, timer) -> tuple[dict, dict]:
    """backend's step (layer by layer) timed with the int8 layers' decode rows on PyTorch's kernel ("torch") and on
    each kernel of int8_rows.KINDS that runs here and keeps the step's logits close to PyTorch's (within
    ROWS_TOLERANCE, or ROWS_FACTOR x gemv_int8.c's error): ({name: seconds}, {name: why not timed})."""
    from minivlm.model.backends import int8_rows
    from minivlm.model.backends.cpu_kernels import gemv
    use_rows(layers, 0)
    exact = step_logits(backend, decoder, kv_caches, block_size)
    top = exact.topk(ROWS_TOP).indices
    times, skipped, errors = {"torch": timer(backend, decoder, kv_caches, block_size)}, {}, {}
    for kind in int8_rows.KINDS:  # GEMV first: its error bounds the others'
        why = kind.available()
        if why is None:
            for m in layers:
                kind.prepare(m)
            use_rows(layers, gemv.MAX_ROWS, kind)
            errors[kind.name] = (step_logits(backend, decoder, kv_caches, block_size)[top] - exact[top]).abs().max()
            bound = max(ROWS_TOLERANCE, ROWS_FACTOR * errors.get("gemv", 0.0))
            if kind is not int8_rows.GEMV and errors[kind.name] > bound:
                why = f"|Δ logprob| {errors[kind.name]:.3f} > {bound:.3f}"
            else:
                times[kind.name] = timer(backend, decoder, kv_caches, block_size)
        if why is not None:
            skipped[kind.name] = why
    return times, skipped


def keep_rows(layers, name: str) -> None:
    """The int8 layers' decode rows on the kernel named (int8_rows.KINDS' name, or "torch"); the others' copies
    freed."""
    from minivlm.model.backends import int8_rows
    from minivlm.model.backends.cpu_kernels import gemv
    kind = next((k for k in int8_rows.KINDS if k.name == name), None)
    use_rows(layers, gemv.MAX_ROWS if kind else 0, kind)
    for other in int8_rows.KINDS:
        if other is not kind:
            for m in layers:
                other.release(m)


def rows_said(times: dict, skipped: dict) -> Said:
    """The rows kernels' times (or why not timed), gemv_int8.c's and fbgemm's, in words."""
    each = {k: Said("engine.rows_ms", ms=f"{times[k] * 1e3:.2f}") if k in times else
            Said("engine.rows_skipped", why=skipped.get(k, "-")) for k in ("gemv", "fbgemm")}
    return Said("engine.rows_times", **each)


def rows_name(name: str) -> Said:
    return Said(f"engine.rows_{name}")


def choose_int8(kernels: Backend, decoder, kv_caches, block_size: int, timer=step_seconds) -> Backend:
    """Quantized int8 weights in an fp32 engine: the C step over them (decode_layer_int8.c in one call, or gemv_int8.c
    layer by layer where that is off) or the fused ops layer by layer with the decode rows on PyTorch's int8 kernel,
    gemv_int8.c or fbgemm's dynamic int8 linear (time_rows: each that runs here and keeps the logits), whichever a
    timed step says is fastest (the C step unless another is MARGIN faster); the backend's `calibration` says the
    times."""
    from minivlm.model.backends.cpu_kernels import gemv, gemv_int8
    from minivlm.model.backends.quantized import Int8Linear
    if os.environ.get(SWITCH, "1") == "0" or gemv_int8.KERNELS.get() is None:
        return kernels
    layers = [m for m in decoder.modules() if isinstance(m, Int8Linear)]
    use_rows(layers, gemv.MAX_ROWS)
    if sum(m.qweight.numel() for m in layers) * 4 < MIN_BYTES:  # untimed, as choose(): a small model's step is
        return kernels  # overhead, which the one call wins by far (timed, a busy machine's noise could pick either)
    ours = timer(kernels, decoder, kv_caches, block_size)
    theirs_backend = kernels.layer_by_layer(Said("engine.calibrated_torch_int8"))
    times, skipped = time_rows(layers, theirs_backend, decoder, kv_caches, block_size, timer)
    best = min(times, key=times.get)
    chosen = kernels if ours <= MARGIN * times[best] else kernels.layer_by_layer(
        Said("engine.calibrated_torch_int8") if best == "torch" else Said("engine.calibrated_rows",
                                                                          kernel=rows_name(best)))
    keep_rows(layers, "gemv" if chosen is kernels else best)
    chosen.calibration = Said("engine.calibrated_int8", gemv=f"{ours * 1e3:.2f}", torch=f"{times['torch'] * 1e3:.2f}",
                              rows=rows_said(times, skipped))
    return chosen


def int4_step_errors(kernels: Backend, torch_backend: Backend, decoder, kv_caches, block_size: int) -> tuple:
    """The largest |Δ logprob| over the top ROWS_TOP tokens against the exact step (the same int4 weights dequantized
    to fp32, fp32 inputs: Int4Linear.exact) of (the C step, that exact step with its inputs rounded to int8 blocks as
    the C step rounds them): what the C kernels lose, and what the Q8 rounding alone (llama.cpp's Q4 x Q8 way, the
    engine's reference for quantized inputs as gemv_int8.c is for int8) loses. The int8 lm_head on PyTorch's kernel
    in all three."""
    from minivlm.model.backends.quantized import Int4Linear, Int8Linear
    use_rows([m for m in decoder.modules() if isinstance(m, Int8Linear)], 0)
    int4 = [m for m in decoder.modules() if isinstance(m, Int4Linear)]
    logits = {}
    try:
        for mode in ("fp32", "q8"):
            for m in int4:
                m.exact = mode
            logits[mode] = step_logits(torch_backend, decoder, kv_caches, block_size)
    finally:
        for m in int4:
            m.exact = None
    exact = logits["fp32"]
    top = exact.topk(ROWS_TOP).indices
    return tuple(float((lp[top] - exact[top]).abs().max())
                 for lp in (step_logits(kernels, decoder, kv_caches, block_size), logits["q8"]))


def choose_int4(kernels: Backend, decoder, kv_caches, block_size: int, timer=step_seconds) -> Backend:
    """Quantized int4 weights in an fp32 engine: the C step over them (decode_layer_int4.c in one call: the nibbles
    times the rows quantized to int8 blocks, int4_weights.h) or the fused ops layer by layer around PyTorch's int4
    kernel (`_weight_int4pack_mm_for_cpu`, the only maintained one on x86), whichever a timed step says is faster;
    the C step only where its top-ROWS_TOP log-probabilities stay within ROWS_TOLERANCE, or ROWS_FACTOR x what the
    Q8 rounding of the inputs alone costs, of the exact step's (int4_step_errors: the same weights, fp32 inputs; the
    int8 choice's gate, with the Q8 reference in gemv_int8.c's place). Then the int8 lm_head (quantized.quantize): its decode rows on PyTorch's int8 kernel,
    gemv_int8.c or fbgemm (time_rows, on the layer-by-layer step), the fastest kept. A real vocabulary's lm_head
    (151,936 x 1,536 in int8: 233 MB) is more bytes than a small model's int4 layers, so its kernel sets much of a
    token's time. A small model is not timed: the C step where it passes the check (its one call wins by far), its
    lm_head's rows on gemv_int8.c. Where PyTorch's kernel is kept the C step's copy of the weights is freed."""
    from minivlm.model.backends.cpu_kernels import gemv
    from minivlm.model.backends.quantized import Int4Linear, Int8Linear
    layers = [m for m in decoder.modules() if isinstance(m, Int8Linear)]
    int4 = [m for m in decoder.modules() if isinstance(m, Int4Linear)]
    if os.environ.get(SWITCH, "1") == "0":
        return kernels
    torch_backend = kernels.layer_by_layer(Said("engine.calibrated_torch_int4")) if kernels.one_call else kernels
    c_why = None
    if kernels.one_call:
        error, q8 = int4_step_errors(kernels, torch_backend, decoder, kv_caches, block_size)
        bound = max(ROWS_TOLERANCE, ROWS_FACTOR * q8)
        if error > bound:
            c_why = f"|Δ logprob| {error:.3f} > {bound:.3f}"
    c_ok = kernels.one_call and c_why is None
    weights = 4 * (sum(m.in_features * m.out_features for m in int4) + sum(m.qweight.numel() for m in layers))
    if weights < MIN_BYTES:  # untimed, as choose_int8: the one call where it passed, gemv_int8.c for the lm_head
        use_rows(layers, gemv.MAX_ROWS if c_ok else 0)
        chosen = kernels if c_ok else torch_backend
    else:
        lm_head = ""
        if sum(m.qweight.numel() for m in layers) * 4 >= MIN_BYTES:  # a small lm_head: PyTorch's kernel, untimed
            times, skipped = time_rows(layers, torch_backend, decoder, kv_caches, block_size, timer)
            best = min(times, key=times.get)
            keep_rows(layers, best)
            lm_head = Said("engine.calibrated_int4_rows", torch=f"{times['torch'] * 1e3:.2f}",
                           rows=rows_said(times, skipped), kernel=rows_name(best))
        else:
            use_rows(layers, 0)
        theirs = timer(torch_backend, decoder, kv_caches, block_size)
        ours = timer(kernels, decoder, kv_caches, block_size) if c_ok else None
        chosen = kernels if c_ok and ours < theirs else torch_backend
        c = Said("engine.rows_ms", ms=f"{ours * 1e3:.2f}") if ours is not None else \
            Said("engine.rows_skipped", why=c_why or kernels.decode)
        chosen.calibration = Said("engine.calibrated_int4", c=c, torch=f"{theirs * 1e3:.2f}", lm_head=lm_head)
    if chosen is not kernels or not kernels.one_call:
        for m in int4:
            m.release_c()
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

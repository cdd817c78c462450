"""Every family x quantization (int8, int4) x dtype (float32, bfloat16) on its random-weight test checkpoint: does it
serve, and how close are its tokens to the unquantized fp32 engine's (max |Δ logprob| of the same token after the
same prefix, as tests/test_quantization.py measures; greedy tokens equal), or what does the refusal say. A first row
a family, the unquantized bf16 engine, says how far rounding alone moves that checkpoint. Each quantized engine is
also measured against the fp32 engine loaded with its own dequantized weights (tools/dequantized_checkpoint.py: the
model its quantized weights define), beside that model's bf16 engine (how far rounding alone moves it): whether the
serving path computes that model, whatever the quantization's error. Each family runs in a subprocess of its own,
so a kernel that ends the process is a row that says "crashed", not a lost run (issue #52). "tiny" is the trained
tiny Qwen2.5-VL (assets/), where tests/test_quantization_matrix.py's bound is measured.

    python -m tools.quantization_matrix [FAMILY ...] [--json]     # prints the table (markdown), or JSON lines

Two more cases use checkpoints whose widths are not multiples of 16 (hidden 40, intermediate 88), the widths that
ended the process before the weights were padded for PyTorch's kernels (minivlm/model/backends/quantized.py)."""
import json
import os
import subprocess
import sys
import tempfile

METHODS = ("int8", "int4")
DTYPES = ("float32", "bfloat16")
ODD = dict(hidden_size=40, intermediate_size=88)  # K = 40, 88 (and 40 x heads): none a multiple of 16
CASES = ["tiny", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3", "smolvlm", "idefics3", "internvl", "qwen2",
         "qwen3", "gemma3:odd", "qwen3_vl:odd"]
MAX_TOKENS = 12
LOGPROBS = 1 << 20  # every token's logprob (the sampler takes at most the vocabulary): any token compares


def make_checkpoint(case: str, out_dir: str) -> str:
    """The case's test checkpoint (the makers the tests use; ':odd' with ODD widths)."""
    family, _, odd = case.partition(":")
    if family == "tiny":  # the trained tiny Qwen2.5-VL (assets/): where the bounds are measured
        from minivlm.config import DEFAULT_MODEL
        return DEFAULT_MODEL
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):  # (Qwen2/2.5-VL take head_dim = hidden / heads: not :odd)
        from tools.make_checkpoint import make_random_checkpoint
        kw = dict(hidden=ODD["hidden_size"], intermediate=ODD["intermediate_size"]) if odd else {}
        return make_random_checkpoint(family, out_dir, seed=1, **kw)
    if family == "qwen3_5":
        from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
        return make_qwen3_5_checkpoint(out_dir, seed=3)
    if family == "gemma3":
        from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
        return make_gemma3_checkpoint(out_dir, seed=4, **(ODD if odd else {}))
    from tools.make_checkpoint_matrix import make_matrix_checkpoint
    return make_matrix_checkpoint(family, out_dir, seed=10)


def requests(text_only: bool):
    from PIL import Image

    from minivlm import Request
    image = Image.new("RGB", (100, 80), (230, 230, 230))
    image.paste((220, 30, 30), (25, 20, 50, 40))
    asked = [Request(prompt="Hello, how are you?")]
    return asked if text_only else [Request(prompt="What color is the shape?", images=[image])] + asked


def closeness(outs, refs) -> tuple[float, int, int]:
    """(max |Δ logprob| of the reference's token at each position where both engines saw the same prefix, the first
    one where they chose apart included, tokens equal, tokens). Past a divergence the prefixes differ and nothing
    compares; at it, the bound says the choice was a near tie."""
    worst, same, total = 0.0, 0, 0
    for o, r in zip(outs, refs):
        same += sum(a == b for a, b in zip(o.token_ids, r.token_ids))
        total += len(r.token_ids)
        for j, b in enumerate(r.token_ids):
            worst = max(worst, abs(o.logprobs[j][b] - r.logprobs[j][b]))
            if o.token_ids[j] != b:
                break
    return worst, same, total


def run_case(case: str) -> list[dict]:
    """This process: the case's checkpoint, the fp32 engine's tokens, then each quantized engine's against them."""
    from minivlm import Engine, EngineConfig, SamplingParams
    from minivlm.families import get_family
    from minivlm.model.backends.quantized import Int4Linear, Int8Linear, padded_layers
    from tools.dequantized_checkpoint import write_dequantized
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=LOGPROBS)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        path = make_checkpoint(case, os.path.join(root, "ckpt"))

        def engine(model=path, **kw):
            return Engine(EngineConfig(model=model, device="cpu", num_blocks=64, max_model_len=1024, **kw))
        with engine(dtype="float32") as e:  # the reference: the unquantized fp32 engine
            reqs = requests(get_family(e.model.model_type).images == "none")
            ref = e.generate(reqs, params)
        for method, dtype in [(None, "bfloat16")] + [(m, d) for m in METHODS for d in DTYPES]:
            row = dict(case=case, method=method or "none", dtype=dtype)
            if method is None:  # how far rounding alone moves this checkpoint
                with engine(dtype=dtype) as e:
                    worst, same, total = closeness(e.generate(reqs, params), ref)
                rows.append({**row, "served": True, "worst": worst, "same": same, "total": total, "padded": 0})
                continue
            try:
                e = engine(dtype=dtype, quantization=method)
            except (ValueError, RuntimeError) as err:
                rows.append({**row, "served": False, "message": str(err)})
                continue
            with e:
                outs = e.generate(reqs, params)
                padded, status = padded_layers(e.model.decoder), e.linear_backend
                widths = [(type(m).__name__, m.in_features, m.out_features) for m in e.model.decoder.modules()
                          if isinstance(m, (Int8Linear, Int4Linear))]
                plain = write_dequantized(path, e.model.decoder, os.path.join(root, f"{method}-{dtype}"))
            worst, same, total = closeness(outs, ref)
            with engine(model=plain, dtype="float32") as e:  # the model its quantized weights define, unquantized
                truth = e.generate(reqs, params)
            exact, exact_same, _ = closeness(outs, truth)
            with engine(model=plain, dtype="bfloat16") as e:  # how far rounding alone moves that model
                exact_drift = closeness(e.generate(reqs, params), truth)[0]
            rows.append({**row, "served": True, "worst": worst, "same": same, "total": total, "padded": len(padded),
                         "exact": exact, "exact_same": exact_same, "exact_drift": exact_drift, "widths": widths,
                         "status": str(status), "status_key": status.key, "status_fields": status.fields})
    return rows


def run_in_subprocess(case: str, timeout: float = 600) -> list[dict]:
    """run_case in a fresh interpreter: its rows, or one row per setting saying how the process ended."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "tools.quantization_matrix", case, "--json"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(rows) != 1 + len(METHODS) * len(DTYPES):
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        settings = [("none", "bfloat16")] + [(m, d) for m in METHODS for d in DTYPES]
        return [dict(case=case, method=m, dtype=d, served=False, crashed=done.returncode or "rows missing",
                     message=f"process ended with {done.returncode}: {tail}") for m, d in settings]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| family | quantization | dtype | against the fp32 engine (the quantization's error) "
             "| against the fp32 engine on its dequantized weights (the serving path's) |", "|---|---|---|---|---|"]
    for r in rows:
        exact = ""
        if not r["served"]:
            what = f"{'CRASHED' if r.get('crashed') else 'refused'}: {r['message']}"
        else:
            what = (f"{r['same']}/{r['total']} greedy tokens equal, max abs Δ logprob {r['worst']:.3f}"
                    + (f", {r['padded']} layers padded" if r["padded"] else ""))
            if "exact" in r:
                exact = (f"{r['exact_same']}/{r['total']} equal, max abs Δ logprob {r['exact']:.3f} "
                         f"(its bf16 engine: {r['exact_drift']:.3f})")
        lines.append(f"| {r['case']} | {r['method']} | {r['dtype']} | {what} | {exact} |")
    return "\n".join(lines)


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    cases = [a for a in args if not a.startswith("--")] or CASES
    if "--json" in args:  # the child: one case in this process
        for case in cases:
            for row in run_case(case):
                print(json.dumps(row), flush=True)
        return
    rows = [row for case in cases for row in run_in_subprocess(case)]
    print(table(rows))


if __name__ == "__main__":
    main()

"""python -m bench.gguf_convert MODEL_DIR [converter args]: llama.cpp's own `convert_hf_to_gguf.py`, from the
vendored source bench/llamacpp_build.py extracts, with two adaptations our random checkpoint needs. Both are
made in this process at import time; the vendored files stay as shipped.

1. Pre-tokenizer: the converter names a BPE pre-tokenizer by hashing the tokens of a fixed text and refuses a
   hash it does not know. Our tiny tokenizer (tools/tiny_tokenizer.py) splits with the plain byte-level GPT-2
   regex, so its hash is registered as llama.cpp's "gpt-2" pre-tokenizer.
2. Vision merger: the converter maps `visual.merger.mlp.{0,2}` through a per-block table sized by the tower's
   depth, so a tower of fewer than 3 blocks has no name for `mlp.2`; the table is widened to 3 blocks (the
   block count written into the GGUF stays the tower's depth).

Needs `sentencepiece` importable (the converter imports it; bench/requirements-peer.txt).
"""
import ast
import hashlib
import inspect
import os
import runpy
import subprocess
import sys
import textwrap

from bench.llamacpp_build import CACHE_DIR, source_dir

MERGER_LAYERS = 3  # visual.merger.mlp.0 and .2 (nn.Sequential: Linear, GELU, Linear)
PRE_TOKENIZER = "gpt-2"  # tools/tiny_tokenizer.py: ByteLevel(use_regex=True), GPT-2's split pattern


def import_converter(src: str = None):
    """The vendored `conversion` package, imported with the gguf-py of the same source (versions match)."""
    src = src or source_dir()
    if not os.path.exists(os.path.join(src, "convert_hf_to_gguf.py")):
        raise FileNotFoundError(f"no llama.cpp source at {src}: run `python -m bench.llamacpp_build` first")
    for path in (os.path.join(src, "gguf-py"), src):
        if path not in sys.path:
            sys.path.insert(0, path)
    import conversion
    import conversion.qwenvl  # noqa: F401  (the classes the patches below reach)
    return conversion


def check_text(text_model_cls) -> str:
    """The fixed text the converter hashes the tokenization of, read from its own source (it is a local)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(text_model_cls.get_vocab_base_pre)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "chktxt":
            return ast.literal_eval(node.value)
    raise RuntimeError("convert_hf_to_gguf: no chktxt in get_vocab_base_pre (converter changed?)")


def pre_tokenizer_hash(tokenizer, text: str) -> str:
    """The converter's identifier of a tokenizer's pre-tokenizer: sha256 of the token ids of its check text."""
    return hashlib.sha256(str(tokenizer.encode(text)).encode()).hexdigest()


def register_pre_tokenizer(text_model_cls, chkhsh: str, name: str) -> None:
    """Make the converter answer `name` for the tokenizer hash `chkhsh`; every other hash goes through as before."""
    original, text = text_model_cls.get_vocab_base_pre, check_text(text_model_cls)

    def get_vocab_base_pre(self, tokenizer):
        if pre_tokenizer_hash(tokenizer, text) == chkhsh:
            return name
        return original(self, tokenizer)

    text_model_cls.get_vocab_base_pre = get_vocab_base_pre


def widen_merger_mapping(vision_cls, gguf, blocks: int = MERGER_LAYERS) -> None:
    """Map per-block tensor names up to index `blocks - 1` even when the tower has fewer blocks."""
    original = vision_cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.block_count < blocks:
            self.tensor_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, blocks)

    vision_cls.__init__ = __init__


def adapt_converter(model_dir: str, src: str = None, pre_tokenizer: str = PRE_TOKENIZER):
    """Import the vendored converter and apply both adaptations for the checkpoint in model_dir."""
    from transformers import AutoTokenizer
    conversion = import_converter(src)
    import gguf
    text_cls = conversion.TextModel
    chkhsh = pre_tokenizer_hash(AutoTokenizer.from_pretrained(model_dir), check_text(text_cls))
    register_pre_tokenizer(text_cls, chkhsh, pre_tokenizer)
    widen_merger_mapping(conversion.qwenvl.Qwen2VLVisionModel, gguf)
    return conversion


def convert_command(model_dir: str, outfile: str, outtype: str, mmproj: bool) -> list:
    return [sys.executable, "-m", "bench.gguf_convert", model_dir, "--outfile", outfile, "--outtype", outtype,
            *(["--mmproj"] if mmproj else [])]


def gguf_dir(model_dir: str, cache=CACHE_DIR) -> str:
    """The cache folder of one checkpoint's GGUF files, keyed by its config and weights size (a changed checkpoint
    converts again)."""
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:12]
    key += "-" + str(sum(os.path.getsize(os.path.join(model_dir, n)) for n in os.listdir(model_dir)
                         if n.endswith(".safetensors")))
    out_dir = os.path.join(cache, "gguf", f"{os.path.basename(os.path.normpath(model_dir))}-{key}")
    os.makedirs(out_dir, exist_ok=True)
    return out_dir


def ensure_gguf(model_dir: str, outtype: str, cache=CACHE_DIR, log=print, mmproj_type: str = None) -> tuple[str, str]:
    """(text model, mmproj) GGUF files of the checkpoint, the text model in `outtype` and the mmproj in
    `mmproj_type` (default the same), converted once into the cache."""
    out_dir = gguf_dir(model_dir, cache)
    mmproj_type = mmproj_type or outtype
    paths = (os.path.join(out_dir, f"model-{outtype}.gguf"), os.path.join(out_dir, f"mmproj-{mmproj_type}.gguf"))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path, kind, mmproj in zip(paths, (outtype, mmproj_type), (False, True)):
        if not os.path.exists(path):
            log(f"[llamacpp] converting {model_dir} to {path} with convert_hf_to_gguf.py")
            done = subprocess.run(convert_command(model_dir, path + ".part", kind, mmproj), cwd=repo,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"convert_hf_to_gguf failed for {path}:\n{done.stderr[-2000:]}")
            os.replace(path + ".part", path)
    return paths


def quantize_command(binary: str, source: str, out: str, qtype: str, threads: int) -> list:
    return [binary, source, out, qtype.upper(), str(threads)]


def ensure_quantized(model_dir: str, qtype: str, quantize_binary: str, cache=CACHE_DIR, log=print,
                     threads: int = 2) -> tuple[str, str]:
    """(text model, mmproj) with the text model in a llama.cpp-only type (e.g. q4_k_m, which the converter cannot
    write) made by llama-quantize from the f32 GGUF; the mmproj stays f16 (the vision tower is prefill only)."""
    source, _ = ensure_gguf(model_dir, "f32", cache, log)
    _, mmproj = ensure_gguf(model_dir, "f16", cache, log)
    path = os.path.join(gguf_dir(model_dir, cache), f"model-{qtype}.gguf")
    if not os.path.exists(path):
        log(f"[llamacpp] quantizing {source} to {qtype} with llama-quantize")
        done = subprocess.run(quantize_command(quantize_binary, source, path + ".part", qtype, threads),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"llama-quantize failed for {path}:\n{(done.stdout + done.stderr)[-2000:]}")
        os.replace(path + ".part", path)
    return path, mmproj


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or not os.path.isdir(argv[0]):
        raise SystemExit("usage: python -m bench.gguf_convert MODEL_DIR [convert_hf_to_gguf.py arguments]")
    adapt_converter(argv[0])
    script = os.path.join(source_dir(), "convert_hf_to_gguf.py")
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

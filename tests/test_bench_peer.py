"""The llama.cpp peer of the bench (bench/peer_llamacpp.py and its helpers). Without llama.cpp's source these
tests check the command lines and the prompt we send; with the source extracted (`python -m bench.llamacpp_build`)
they check both converter adaptations against the vendored converter itself and convert the smoke checkpoint;
with the build, the slow test runs the peer rows end to end. CI has neither and never compiles llama.cpp."""
import os

import pytest

import torch

from bench import llamacpp_build, llamacpp_server, peer_quantized
from bench.gguf_convert import convert_command, quantize_command
from bench.workload import SMOKE_MODEL, build_checkpoint, scene
from minivlm import Request

HAS_SOURCE = os.path.exists(os.path.join(llamacpp_build.source_dir(), "convert_hf_to_gguf.py"))
needs_source = pytest.mark.skipif(not HAS_SOURCE, reason="llama.cpp source not extracted: "
                                                          "python -m bench.llamacpp_build")


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("peer") / "ckpt"), SMOKE_MODEL)


def test_build_is_release_cpu_only_and_reused_only_when_flags_match(tmp_path):
    configure = llamacpp_build.configure_command(str(tmp_path))
    assert "-DCMAKE_BUILD_TYPE=Release" in configure and "-DGGML_CUDA=OFF" in configure
    assert configure[configure.index("-S") + 1].endswith("vendor/llama.cpp")
    assert llamacpp_build.build_command(2, str(tmp_path))[-3:] == ["--target", "llama-server", "llama-quantize"]
    assert not llamacpp_build.is_built(str(tmp_path))
    os.makedirs(os.path.dirname(llamacpp_build.binary("llama-server", str(tmp_path))))
    for target in llamacpp_build.TARGETS:
        open(llamacpp_build.binary(target, str(tmp_path)), "w").close()
    stamp = tmp_path / "build" / "minivlm-stamp.json"
    stamp.write_text('{"sdist": "llama-cpp-python==0.0.1"}')
    assert not llamacpp_build.is_built(str(tmp_path))  # built from another sdist: rebuild
    stamp.write_text(__import__("json").dumps(llamacpp_build.stamp()))
    assert llamacpp_build.is_built(str(tmp_path))
    os.remove(llamacpp_build.binary("llama-quantize", str(tmp_path)))
    assert not llamacpp_build.is_built(str(tmp_path))  # a build from before Q4_K_M: build the quantizer too


def test_server_command_batches_on_the_same_threads():
    cmd = llamacpp_server.server_command("llama-server", "m.gguf", "mm.gguf", 8080, threads=2, slots=16)
    assert cmd[cmd.index("-np") + 1] == "16" and "-cb" in cmd
    assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == "2"
    assert cmd[cmd.index("--mmproj") + 1] == "mm.gguf" and cmd[cmd.index("--cache-ram") + 1] == "0"
    assert convert_command("ckpt", "out.gguf", "f16", mmproj=True)[-5:] == [
        "--outfile", "out.gguf", "--outtype", "f16", "--mmproj"]
    assert quantize_command("llama-quantize", "m-f32.gguf", "m-q4.gguf", "q4_k_m", 2) == [
        "llama-quantize", "m-f32.gguf", "m-q4.gguf", "Q4_K_M", "2"]


def test_peer_model_is_about_340m_and_its_pairs_cover_each_precision():
    from bench.workload import PEER_MODEL
    from tools.make_checkpoint import build_tokenizer, tiny_config
    from transformers import Qwen2_5_VLForConditionalGeneration
    with torch.device("meta"):  # parameters counted without allocating them
        model = Qwen2_5_VLForConditionalGeneration(tiny_config("qwen2_5_vl", build_tokenizer(), **PEER_MODEL))
    params = sum(p.numel() for p in model.parameters())
    assert 320e6 < params < 370e6 and PEER_MODEL["kv_heads"] < PEER_MODEL["heads"]  # GQA
    text = params - sum(p.numel() for p in model.model.visual.parameters())
    assert 330e6 < text * 34 / 32 < 390e6  # Q8_0: 34 bytes per 32 weights, ~360 MB
    for spec in (PEER_MODEL, peer_quantized.SMOKE_PEER_MODEL):  # Q4_K blocks are 256 wide: no fallback type
        assert spec["hidden"] % 256 == 0 and spec["intermediate"] % 256 == 0
    assert [q for _, _, q, _ in peer_quantized.PAIRS] == ["f32", "f16", "q8_0", "q4_k_m"]
    assert [g for *_, g in peer_quantized.PAIRS] == [None, 1.0, 1.0, None]  # the goal rows: bf16 vs F16, int8 vs Q8_0


def test_cpu_flags_name_the_simd_features_present_and_absent(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_tile\n")
    have, absent = peer_quantized.cpu_flags(str(info)).split("; absent: ")
    assert have.split() == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]
    assert "avx512_vnni" in absent.split() and "amx_int8" in absent.split()
    assert "unknown" in peer_quantized.cpu_flags(str(tmp_path / "missing"))


def test_llama_logprobs_are_read_per_chunk_and_compared_while_tokens_agree():
    body = llamacpp_server.completion_body("p", [], 4, logprobs=True)
    assert body["n_probs"] == 1 and body["post_sampling_probs"] is False  # raw logits: top_k 1 would give 0
    assert "n_probs" not in llamacpp_server.completion_body("p", [], 4)
    chunk = {"tokens": [5], "completion_probabilities": [{"id": 5, "logprob": -0.25, "top_logprobs": []}]}
    assert llamacpp_server.chunk_logprobs(chunk) == [-0.25] and llamacpp_server.chunk_logprobs({}) == []
    ref = peer_quantized.llama_output([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4])
    out = peer_quantized.llama_output([1, 2, 9, 4], [-0.15, -0.1, -5.0, -0.4])
    same, worst = peer_quantized.compare(out, ref)
    assert same == 2 and abs(worst - 0.1) < 1e-9  # the differing third token's logprob is not counted
    no_probs = peer_quantized.llama_output([1, 2, 9], [])
    assert peer_quantized.compare(no_probs, ref) == (2, None)
    assert peer_quantized.fmt_worst(0, 0.0).startswith("n/a")  # nothing equal: no logprob to compare


def test_busy_row_keeps_the_quiet_ratio_goal():
    quiet = {"engine": {"int8": [10.0]}, "llama": {"q8_0": [8.0]}, "load": [0.2, 0.4]}
    busy = {"engine": {"int8": [6.0]}, "llama": {"q8_0": [5.0]}, "load": [1.1, 1.3]}
    row = peer_quantized.busy_row("340M", "int8", "q8_0", quiet, busy)
    assert row.ratio == 1.2 and row.goal == ">= 1.00x (0.8 x quiet)" and row.passed  # 1.2 >= 0.8 * 1.25
    assert "engine keeps 60%" in row.note and "llama.cpp keeps 62%" in row.note and "keeps 96%" in row.note
    assert "load average 1.1–1.3 (quiet 0.2–0.4" in row.note
    assert "%" not in row.goal  # the table prints the ratio as x, not as a percentage
    with peer_quantized.busy_core() as proc:
        assert proc.poll() is None
    assert proc.poll() is not None  # killed after the timed part


def test_llama_prompt_is_the_engines_chat_prompt_with_a_media_marker(smoke_dir):
    from minivlm.inputs.processor import load_processor
    processor = load_processor(smoke_dir, "qwen2_5_vl")
    request = Request(prompt="What color is the shape?", images=[scene(224, 224, 1)])
    prompt = llamacpp_server.llama_prompt(processor, request)
    assert prompt == ("<|im_start|>user\n" + llamacpp_server.MEDIA_MARKER + "What color is the shape?<|im_end|>\n"
                      "<|im_start|>assistant\n")
    body = llamacpp_server.completion_body(prompt, request.images, 8)
    assert len(body["prompt"]["multimodal_data"]) == 1 and body["n_predict"] == 8 and body["ignore_eos"]


@needs_source
def test_pre_tokenizer_registration_maps_only_our_tokenizer(smoke_dir, monkeypatch):
    from transformers import AutoTokenizer
    from bench import gguf_convert
    from tools.tiny_tokenizer import build_tokenizer
    text_cls = gguf_convert.import_converter().TextModel
    monkeypatch.setattr(text_cls, "get_vocab_base_pre", text_cls.get_vocab_base_pre)  # restored after the test
    ours, other = AutoTokenizer.from_pretrained(smoke_dir), build_tokenizer(vocab_size=300)
    with pytest.raises(NotImplementedError):  # the vendored converter refuses our tokenizer as shipped
        text_cls.get_vocab_base_pre(None, ours)
    text = gguf_convert.check_text(text_cls)
    gguf_convert.register_pre_tokenizer(text_cls, gguf_convert.pre_tokenizer_hash(ours, text), "gpt-2")
    assert text_cls.get_vocab_base_pre(None, ours) == "gpt-2"
    with pytest.raises(NotImplementedError):  # another unknown tokenizer is still refused
        text_cls.get_vocab_base_pre(None, other)


@needs_source
def test_merger_mapping_widened_for_a_shallow_tower():
    from bench import gguf_convert
    gguf_convert.import_converter()
    import gguf
    shallow = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 2)
    assert shallow.get_name("visual.merger.mlp.2.weight", (".weight",)) is None  # why the adaptation exists
    widened = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, gguf_convert.MERGER_LAYERS)
    assert widened.get_name("visual.merger.mlp.2.weight", (".weight",)) == "mm.2.weight"


@needs_source
def test_smoke_checkpoint_converts_to_text_and_mmproj_gguf(smoke_dir, tmp_path):
    pytest.importorskip("sentencepiece")
    from bench.gguf_convert import ensure_gguf, import_converter
    import_converter()
    import gguf
    model, mmproj = ensure_gguf(smoke_dir, "f32", cache=str(tmp_path), log=lambda *_: None)
    text = gguf.GGUFReader(model)
    pre = text.fields["tokenizer.ggml.pre"]
    assert bytes(pre.parts[pre.data[0]]).decode() == "gpt-2"
    blocks = text.fields["qwen2vl.block_count"]
    assert int(blocks.parts[blocks.data[0]][0]) == SMOKE_MODEL["layers"]
    vision = gguf.GGUFReader(mmproj)
    names = {t.name for t in vision.tensors}
    assert {"mm.0.weight", "mm.2.weight"} <= names  # the merger MLP's both linears made it through
    depth = vision.fields["clip.vision.block_count"]
    assert int(depth.parts[depth.data[0]][0]) == SMOKE_MODEL["vision_depth"]
    assert ensure_gguf(smoke_dir, "f32", cache=str(tmp_path), log=pytest.fail) == (model, mmproj)  # reused


@pytest.mark.slow
@pytest.mark.skipif(not llamacpp_build.is_built(), reason="llama.cpp not built: python -m bench.llamacpp_build")
def test_peer_rows_end_to_end_on_the_smoke_model(tmp_path):
    from bench.__main__ import main
    rows, details = main(["--smoke", "--repeats", "1", "--threads", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
                          "--only", "--peer", "llamacpp"])
    label = details["peer_llamacpp_precision"]["label"]
    pairs = [f"{label} single-stream decode, engine {n} vs llama.cpp {q.upper()}"
             for n, _, q, _ in peer_quantized.PAIRS]
    assert [r.metric for r in rows] == [
        "single-stream decode vs llama.cpp f32", "single-stream decode vs llama.cpp f16",
        "uniform: throughput vs llama-server -np 16 -cb f32", "uniform: throughput vs llama-server -np 16 -cb f16",
        *pairs, *[p + ", one busy core" for p in pairs]]
    assert all(r.engine > 0 and r.baseline > 0 for r in rows)
    assert "no logprobs returned" not in rows[6].note  # llama-server sent per-token logprobs (Q8_0 vs f32)
    assert rows[5].goal == rows[6].goal == ">= 1.0x" and rows[-1].goal.endswith("(0.8 x quiet)")
    # both sides were given the same prompts: llama.cpp counts as many prompt tokens (text + image) as the engine
    batch = details["peer_llamacpp_batch"]
    assert batch["prompt_tokens"]["f32"] == batch["prompt_tokens"]["engine"]

"""The llama.cpp peer of the bench (bench/peer_llamacpp.py and its helpers). Without llama.cpp's source these
tests check the command lines and the prompt we send; with the source extracted (`python -m bench.llamacpp_build`)
they check both converter adaptations against the vendored converter itself and convert the smoke checkpoint;
with the build, the slow test runs the peer rows end to end. CI has neither and never compiles llama.cpp."""
import os

import pytest

from bench import llamacpp_build, llamacpp_server
from bench.gguf_convert import convert_command
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
    assert llamacpp_build.build_command(2, str(tmp_path))[-2:] == ["--target", "llama-server"]
    assert not llamacpp_build.is_built(str(tmp_path))
    binary = llamacpp_build.binary("llama-server", str(tmp_path))
    os.makedirs(os.path.dirname(binary))
    open(binary, "w").close()
    stamp = tmp_path / "build" / "minivlm-stamp.json"
    stamp.write_text('{"sdist": "llama-cpp-python==0.0.1"}')
    assert not llamacpp_build.is_built(str(tmp_path))  # built from another sdist: rebuild
    stamp.write_text(__import__("json").dumps(llamacpp_build.stamp()))
    assert llamacpp_build.is_built(str(tmp_path))


def test_server_command_batches_on_the_same_threads():
    cmd = llamacpp_server.server_command("llama-server", "m.gguf", "mm.gguf", 8080, threads=2, slots=16)
    assert cmd[cmd.index("-np") + 1] == "16" and "-cb" in cmd
    assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == "2"
    assert cmd[cmd.index("--mmproj") + 1] == "mm.gguf" and cmd[cmd.index("--cache-ram") + 1] == "0"
    assert convert_command("ckpt", "out.gguf", "f16", mmproj=True)[-5:] == [
        "--outfile", "out.gguf", "--outtype", "f16", "--mmproj"]


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
    assert [r.metric for r in rows] == [
        "single-stream decode vs llama.cpp f32", "single-stream decode vs llama.cpp f16",
        "uniform: throughput vs llama-server -np 16 -cb f32", "uniform: throughput vs llama-server -np 16 -cb f16"]
    assert all(r.engine > 0 and r.baseline > 0 for r in rows)
    # both sides were given the same prompts: llama.cpp counts as many prompt tokens (text + image) as the engine
    batch = details["peer_llamacpp_batch"]
    assert batch["prompt_tokens"]["f32"] == batch["prompt_tokens"]["engine"]

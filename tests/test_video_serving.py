"""Video served: key C at two fps and two frame counts (and B fooled), the cache inspector's preset, the KV map's
video blocks, limits checked from the header, MP4 through PyAV, the HTTP API's video_url, the VRAM calculator's
video workload. Truths: exact block keys, the engine's own prompt, a real MP4 encoder."""
import io
import json
import os

import numpy as np
import pytest

from minivlm import Request, SamplingParams
from minivlm.engine.kv_cache.prefix_keys import block_key
from minivlm.inputs.video import MAX_SOURCE_FRAMES, MAX_VIDEO_BYTES
from tests.conftest import FAMILIES
from tests.test_video import request_of
from tools.video_clips import gif_bytes, moving_square


def video_request(fps=None, num_frames=None, frames=8, gif=False):
    clip = moving_square(frames)
    item = {"type": "video", "video": gif_bytes(clip, 8) if gif else clip}
    if fps is not None:
        item["fps"] = fps
    if num_frames is not None:
        item["num_frames"] = num_frames
    return Request(messages=[{"role": "user", "content": [item, {"type": "text", "text": "What happens?"}]}])


def video_blocks(engine, request, strategy):
    seq = engine.make_sequence(request, SamplingParams(max_tokens=4))
    video = seq.images[0]
    bs = engine.config.block_size
    out, parent = [], None
    for i in range(len(seq) // bs):
        key, _ = block_key(seq, i, parent, bs, strategy, engine.config.model, "float32")
        parent = key
        if i * bs < video.end and (i + 1) * bs > video.start:
            out.append(key)
    return set(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_same_video_at_two_fps_or_frame_counts_shares_no_video_block_under_c(family, engines):
    """The same frames at another fps, and the same file sampled to another frame count: key C never lets a block
    holding video tokens be reused; on Qwen2.5-VL (same tokens, only the time axis moves) B is fooled."""
    engine = engines[family]
    pairs = [(video_request(fps=2), video_request(fps=4)),
             (video_request(gif=True, frames=16, num_frames=4), video_request(gif=True, frames=16, num_frames=8))]
    for a, b in pairs:
        assert not video_blocks(engine, a, "C") & video_blocks(engine, b, "C")
    if family == "qwen2_5_vl":
        a, b = pairs[0]
        shared = video_blocks(engine, a, "B") & video_blocks(engine, b, "B")
        assert shared, "B should be fooled: same frames, same tokens"
    engine.reset_prefix_cache()
    first = engine.generate(pairs[0][0], SamplingParams(max_tokens=2, ignore_eos=True))
    second = engine.generate(pairs[0][1], SamplingParams(max_tokens=2, ignore_eos=True))
    video = engine.make_sequence(pairs[0][1], SamplingParams(max_tokens=2)).images[0]
    bs = engine.config.block_size
    assert second.num_cached_tokens <= video.start // bs * bs, "a block holding video tokens was reused under C"
    assert first.token_ids is not None


def screen_gif(width: int, height: int, frames: int) -> bytes:
    """A GIF whose header announces a width x height screen, holding `frames` frames of one pixel each (a bomb)."""
    import struct
    out = b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
    for _ in range(frames):  # graphic control (100 ms), a 1x1 frame with a 2-colour table, LZW: clear, 0, end
        out += b"\x21\xf9\x04\x00\x0a\x00\x00\x00" + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0x80)
        out += b"\x00\x00\x00\xff\xff\xff" + b"\x02\x02\x44\x01\x00"
    return out + b"\x3b"


def test_video_refused_from_its_header_with_the_limit(engines):
    engine = engines["qwen2_5_vl"]
    big = b"\0" * (MAX_VIDEO_BYTES + 1)
    with pytest.raises(ValueError, match="MiB limit per video"):
        engine.make_sequence(Request(messages=[{"role": "user", "content": [{"type": "video", "video": big}]}]),
                             SamplingParams())
    with pytest.raises(ValueError, match="not a readable video"):
        engine.make_sequence(Request(messages=[{"role": "user", "content": [{"type": "video", "video": b"nope"}]}]),
                             SamplingParams())
    long_gif = gif_bytes(moving_square(2), 1 / 400)  # 2 frames of 400 s each: over the duration limit
    with pytest.raises(ValueError, match="s limit per video"):
        engine.make_sequence(Request(messages=[{"role": "user", "content": [{"type": "video", "video": long_gif}]}]),
                             SamplingParams())
    assert MAX_SOURCE_FRAMES > 1000
    big_gif = screen_gif(8000, 8000, 5)  # 159 bytes announcing 5 frames of 64 MP: refused before a frame is read
    with pytest.raises(ValueError, match="5 frames of 8000x8000 = 320 MP, over the 256 MP limit per animated image"):
        engine.make_sequence(Request(messages=[{"role": "user", "content": [{"type": "video", "video": big_gif}]}]),
                             SamplingParams())
    with pytest.raises(ValueError, match="fps must be"):
        engine.make_sequence(video_request(fps=-1), SamplingParams())
    out = engine.generate(video_request(fps=4), SamplingParams(max_tokens=2))  # and it keeps serving
    assert len(out.token_ids) == 2


def test_mp4_decoded_with_pyav(engines):
    """An MP4 written with PyAV (lossless H.264 RGB) decodes to the frames that went in, sampled at the asked fps."""
    av = pytest.importorskip("av")
    frames = moving_square(12, 64, 48)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264rgb", rate=6)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "rgb24"
        stream.options = {"crf": "0", "preset": "ultrafast"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_image(f)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    from minivlm.inputs.video import decode_frames, open_video
    source = open_video(buf.getvalue(), None, "clip")
    assert (source.total_frames, source.fps, source.width, source.height) == (12, 6.0, 64, 48)
    got = decode_frames(source, [0, 5, 11])
    assert np.abs(got.astype(int) - np.stack([np.asarray(frames[i]) for i in (0, 5, 11)]).astype(int)).max() <= 2
    engine = engines["qwen3_vl"]
    seq = engine.make_sequence(Request(messages=[{"role": "user", "content": [
        {"type": "video", "video": buf.getvalue(), "fps": 2}, {"type": "text", "text": "What happens?"}]}]),
        SamplingParams())
    assert seq.images[0].video.indices == np.linspace(0, 11, 4).round().astype(int).tolist()


def test_openai_video_url_data_url_reaches_the_engine(engines):
    """vLLM's video_url part with a data: URL and mm_processor_kwargs.fps, parsed and translated as the API does;
    a refusal maps to an OpenAI error naming the limit."""
    import base64
    from minivlm.api.errors import ApiError, from_engine
    from minivlm.api.media import engine_messages
    from minivlm.api.protocol import parse_request
    gif = gif_bytes(moving_square(20), 10)  # 2 s
    body = {"model": "m", "mm_processor_kwargs": {"fps": 4},
            "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": "data:image/gif;base64," + base64.b64encode(gif).decode()}},
                {"type": "text", "text": "What happens?"}]}]}
    messages = engine_messages(parse_request(json.dumps(body).encode()), [])
    assert messages[0]["content"][0] == {"type": "video", "video": gif, "fps": 4}
    engine = engines["qwen2_5_vl"]
    seq = engine.make_sequence(Request(messages=messages), SamplingParams(max_tokens=2))
    assert seq.images[0].kind == "video" and len(seq.images[0].video.indices) == 8  # 2 s at 4 fps
    body["messages"][0]["content"][0]["video_url"]["url"] = "data:text/plain;base64,aGk="
    with pytest.raises(ApiError, match="not an video/\\* or image/\\* type"):
        engine_messages(parse_request(json.dumps(body).encode()), [])
    try:
        engine.make_sequence(Request(messages=[{"role": "user", "content": [
            {"type": "video", "video": gif_bytes(moving_square(2), 1 / 400)}]}]), SamplingParams())
    except ValueError as e:
        err = from_engine(e)
    assert err.status == 400 and err.code == "video_too_large" and "600 s limit per video" in err.message


def test_kv_map_marks_video_blocks(engines):
    """Blocks holding a video's tokens are kind "video" in the KV snapshot (and in the plot's markers)."""
    from panels.plots import block_map_figure
    engine = engines["qwen3_vl"]
    engine.reset_prefix_cache()
    events = list(engine.stream(request_of("mixed"), SamplingParams(max_tokens=2, ignore_eos=True)))
    snap = next(e.snapshot for e in events if e.snapshot is not None)
    seq = engine.make_sequence(request_of("mixed"), SamplingParams(max_tokens=1))
    bs = snap.block_size
    table = next(iter(snap.block_tables.values()))
    kinds = {b.block_id: b.kind for b in snap.blocks}
    videos = [im for im in seq.images if im.kind == "video"]
    for j, b in enumerate(table[:seq.num_prompt_tokens // bs]):
        touches = any(v.start < (j + 1) * bs and v.end > j * bs for v in videos)
        assert (kinds[b] == "video") == touches, f"block L{j} #{b}: {kinds[b]}"
    fig = block_map_figure(snap)
    assert any(t.name == "video tokens" and len(t.x) for t in fig.data)


def test_inspector_video_preset_shows_b_fooled_and_c_not(engines):
    """The cache inspector's "same video, different fps" preset on Qwen2.5-VL: B reuses video blocks computed at the
    other fps (false hits), C reuses none of them."""
    from panels.cache_inspector import VIDEO_PRESET, _example, run_video_pair
    from panels.cache_inspector import video_request as inspector_request
    engine = engines["qwen2_5_vl"]
    _, clip, fps_1, fps_2, question = VIDEO_PRESET
    out, cold = run_video_pair(engine, _example(clip), fps_1, fps_2, question, 2)
    assert sum(h.false_hit for h in out["B"][0].cache_hits) > 0
    assert not any(h.false_hit for h in out["C"][0].cache_hits)
    video = engine.make_sequence(inspector_request(_example(clip), fps_2, question), SamplingParams()).images[0]
    assert out["C"][0].num_cached_tokens <= video.start
    assert out["C"][0].token_ids == cold.token_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_vram_calculator_counts_video_tokens_by_the_engines_rule(family, engines, checkpoints):
    """"video: 3 s at 2 fps" in the calculator: the same frames, frame pairs and placeholder tokens as the engine's
    prompt for the 3 s example clip; the video's tokens enter the per-request demand."""
    from minivlm.budget import estimate
    from panels.holder import EXAMPLES_DIR as examples
    clip = os.path.join(examples, "moving_square.mp4")
    seq = engines[family].make_sequence(Request(messages=[{"role": "user", "content": [
        {"type": "video", "video": clip, "fps": 2}, {"type": "text", "text": "hi"}]}]), SamplingParams())
    video = seq.images[0]
    common = dict(device_memory_gb=24, max_model_len=1024, num_seqs=2, images_per_request=0, image_size=(96, 72))
    est = estimate(checkpoints[family], videos_per_request=1, video_seconds=3, video_fps=2, **common)
    assert (est.video.frames, est.video.pairs, est.video.vision_tokens) == (
        len(video.video.indices), video.grid_thw[0], video.num_tokens)
    assert est.needed_tokens_per_request == estimate(checkpoints[family], **common).needed_tokens_per_request \
        + est.video.tokens

"""Bad input gets a specific ValueError and the engine keeps serving; cancelled requests free their blocks."""
import io
import threading

import numpy as np
import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.inputs.images import load_image


def png_bytes(img: Image.Image, fmt="PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def red(size=(80, 60)):
    return Image.new("RGB", size, (220, 30, 30))


def bomb_png() -> bytes:
    return png_bytes(Image.new("1", (12_000, 12_000)))  # 144 MP, a few KB on disk


BAD_REQUESTS = {
    "corrupt bytes": (lambda: Request(prompt="hi", images=[b"\x89PNG\r\n\x1a\n garbage"]), "not a readable image"),
    "truncated png": (lambda: Request(prompt="hi", images=[png_bytes(red((300, 300)))[:200]]), "not a readable image"),
    "text file": (lambda: Request(prompt="hi", images=["/etc/hostname"]), "not a readable image"),
    "missing path": (lambda: Request(prompt="hi", images=["/no/such/image.png"]), "does not exist"),
    "not an image object": (lambda: Request(prompt="hi", images=[3.14]), "PIL.Image, encoded bytes or a file path"),
    "zero-size image": (lambda: Request(prompt="hi", images=[Image.new("RGB", (0, 0))]), "zero size"),
    "decompression bomb": (lambda: Request(prompt="hi", images=[bomb_png()]), "MP limit"),
    "empty request": (lambda: Request(prompt="   "), "empty request"),
    "prompt too long": (lambda: Request(prompt="hello " * 3000), "max_model_len"),
    "too many images": (lambda: Request(prompt="hi", images=[red()] * 9), "too many images"),
    "malformed messages": (lambda: Request(messages=[{"text": "hi"}]), "'role' and 'content'"),
    "empty messages": (lambda: Request(messages=[]), "non-empty list"),
    "both prompt and messages": (lambda: Request(prompt="a", messages=[{"role": "user", "content": "b"}]), "not both"),
    "image item without image": (lambda: Request(messages=[{"role": "user", "content": [{"type": "image"}]}]), "no 'image'"),
    "unknown processor kwarg": (lambda: Request(prompt="hi", images=[red()], mm_processor_kwargs={"fps": 2}), "unsupported mm_processor_kwargs"),
    "max_pixels too small": (lambda: Request(prompt="hi", images=[red()], mm_processor_kwargs={"max_pixels": 10}), "min_pixels <= max_pixels"),
    "not a Request": (lambda: {"prompt": "hi"}, "expected a minivlm.Request"),
}


@pytest.fixture(scope="module")
def engine(checkpoints):
    e = Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=128, max_model_len=1024))
    yield e
    e.close()


@pytest.mark.parametrize("name", BAD_REQUESTS)
def test_bad_input_is_refused_clearly_and_engine_keeps_serving(engine, name):
    make, message = BAD_REQUESTS[name]
    with pytest.raises(ValueError, match=message):
        engine.generate(make(), SamplingParams(max_tokens=2))
    good = engine.generate(Request(prompt="What color is the shape?", images=[red()]), SamplingParams(max_tokens=3))
    assert good.finish_reason in ("stop", "length") and good.num_prompt_tokens > 0


def test_request_that_can_never_fit_is_refused_up_front(checkpoints):
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=4, block_size=8)) as small:
        with pytest.raises(ValueError, match="KV blocks"):
            small.generate(Request(prompt="hi"), SamplingParams(max_tokens=200))


def test_modes_and_orientation_are_converted_correctly():
    base = Image.new("RGB", (40, 20), (40, 70, 220))
    cmyk, notes = load_image(png_bytes(base.convert("CMYK"), "JPEG", quality=95))
    assert cmyk.mode == "RGB" and np.abs(np.asarray(cmyk, int) - [40, 70, 220]).max() < 12 and notes
    for mode in ("LA", "P", "RGBA", "L"):
        img, notes = load_image(png_bytes(base.convert(mode)))
        assert img.mode == "RGB" and img.size == (40, 20) and "converted" in notes[0]
    transparent = Image.new("RGBA", (10, 10), (255, 0, 0, 0))
    assert load_image(transparent)[0].getpixel((5, 5)) == (255, 255, 255)  # alpha over white, not black
    deep = Image.fromarray(np.full((8, 8), 40000, dtype=np.uint16))
    assert load_image(png_bytes(deep))[0].getpixel((0, 0)) == (156, 156, 156)  # 16-bit scaled to 8-bit
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90°: a 40x20 file shows as 20x40
    rotated, _ = load_image(png_bytes(base, "JPEG", exif=exif))
    assert rotated.size == (20, 40)


def test_animated_gif_uses_first_frame_and_says_so(engine):
    frames = [Image.new("RGB", (64, 64), c) for c in [(220, 30, 30), (40, 70, 220), (30, 170, 60)]]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    img, notes = load_image(buf.getvalue())
    assert img.getpixel((1, 1))[0] > 200 and "first of 3 frames" in notes[0]
    out = engine.generate(Request(prompt="hi", images=[buf.getvalue()]), SamplingParams(max_tokens=2))
    assert any("animated" in n for n in out.notes)


def test_cancelled_streams_free_all_their_blocks(engine):
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    started = threading.Barrier(10)

    def stream_then_close(i):
        gen = engine.stream(Request(prompt=f"Describe image {i}", images=[red((64 + 8 * i, 64))]), params)
        next(gen), next(gen)
        started.wait(timeout=60)
        gen.close()  # the stop button / a closed tab

    threads = [threading.Thread(target=stream_then_close, args=(i,)) for i in range(10)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    for _ in range(100):
        if not engine.has_unfinished():
            break
        threading.Event().wait(0.05)
    snap = engine.snapshot()
    assert not engine.has_unfinished() and not snap.block_tables
    assert all(b.ref_count == 0 for b in snap.blocks)


def test_hub_id_downloads_through_huggingface_hub(checkpoints, monkeypatch):
    import huggingface_hub
    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, **kw: asked.append(repo_id) or checkpoints["qwen2_vl"])
    with Engine(EngineConfig(model="Qwen/Qwen2-VL-2B-Instruct", num_blocks=16)) as e:
        assert asked == ["Qwen/Qwen2-VL-2B-Instruct"] and e.model_type == "qwen2_vl"


def test_hub_id_offline_is_one_clear_error(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id, **kw):
        raise LocalEntryNotFoundError("cannot reach the hub")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match=r"could not fetch model 'Qwen/Qwen2.5-VL-3B-Instruct'.*huggingface-cli download"):
        Engine(EngineConfig(model="Qwen/Qwen2.5-VL-3B-Instruct", num_blocks=16))


def test_missing_and_corrupt_checkpoints_are_clear_errors(checkpoints, tmp_path):
    import shutil
    with pytest.raises(ValueError, match="neither a local checkpoint directory nor a hub id"):
        Engine(EngineConfig(model="no_such_model_dir", num_blocks=8))
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["qwen2_vl"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="corrupt weights file"):
        Engine(EngineConfig(model=str(broken), num_blocks=8))

"""The sliced vision tower on the timeline (async_vision with the adaptive chunk budget): each slice the loop lent
it is a `tower_slice` event, drawn on the image request's row. Real time here (the tower runs on its own thread):
every slice lies between two steps, never inside one, and there are at least as many as the tower says it ran in."""
from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.experiments.mm_cache import RED, shape_image
from minivlm.views.events import describe
from minivlm.views.timeline import TOWER, timeline


def test_each_lent_slice_is_a_span_between_two_steps():
    config = EngineConfig(device="cpu", dtype="float32", num_blocks=96, max_model_len=1024, async_vision=True,
                          enable_chunked_prefill=True)  # the adaptive budget: the tower runs only in lent slices
    with Engine(config) as engine:
        since = engine.snapshot().last_event_seq
        stream = engine.submit(Request(prompt="Count slowly from one to fifty.", request_id="text"),
                               SamplingParams(max_tokens=40, ignore_eos=True))
        stream.get(30)  # decoding: steps run while the image is encoded
        image = engine.submit(Request(prompt="What color is the shape?", images=[shape_image(RED, size=(448, 448))],
                                      request_id="image"), SamplingParams(max_tokens=4, ignore_eos=True))
        for h in (stream, image):
            for _ in h:
                pass
        events = engine.events(since)
    tl = timeline(events)
    slices = [s for s in tl.requests["image"].spans if s.kind == TOWER]
    encoded = next(e for e in events if e.kind == "vision_encoded")
    assert encoded.slices > 0 and len(slices) >= encoded.slices
    for s in slices:
        assert s.end >= s.start
        assert not any(st.started < s.end and s.start < st.ended for st in tl.steps), s  # never inside a step
    vision = next(s for s in tl.requests["image"].spans if s.kind == "vision")
    assert all(vision.start <= s.start and s.end <= vision.end for s in slices)  # within its wait for the tower
    assert vision.tower_seconds == encoded.seconds and vision.slices == encoded.slices
    said = describe(next(e for e in events if e.kind == "tower_slice"))
    assert said.startswith("the vision tower ran ") and "in a slice lent after step" in said

"""The contract's import paths (docs/API.md) survive the engine/ and views/ packages: a check outside the project
that writes `from minivlm.events import replay` gets the same replay the views use."""
import os


def test_the_documented_import_paths_work_and_replay_equals_the_snapshot():
    from minivlm import Engine, EngineConfig, Request, SamplingParams
    from minivlm.budget import estimate  # noqa: F401
    from minivlm.events import replay
    from minivlm.views.events import replay as views_replay
    assert replay is views_replay
    image = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples",
                         "red_circle.png")
    with Engine(EngineConfig(device="cpu", num_blocks=32)) as engine:
        engine.generate([Request(prompt="What color is the shape?", images=[image])] * 2, SamplingParams(max_tokens=4))
        snap = engine.snapshot()
        again = replay(engine.events(), num_blocks=engine.num_blocks, block_size=engine.config.block_size)
    assert [(b.block_id, b.ref_count, b.block_hash, b.kind, b.cached) for b in again.blocks] == \
        [(b.block_id, b.ref_count, b.block_hash, b.kind, b.cached) for b in snap.blocks]

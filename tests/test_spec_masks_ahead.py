"""Grammar masks of speculating requests filled ahead (#55): where the engine fills a step's masks on a worker thread
from the previous step's update ("ahead", its choice beside an accelerator), a speculating request's rows along the
guesses it will verify fill there too (the speculator's upcoming guesses; the step takes a prefix of them). Filling
ahead is for speed only: in every fill mode the tokens and the step-through's counts are the same, and the rows taken
from masks filled along longer guesses equal the library's own rows filled along the shorter ones."""
import pytest
import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO
from minivlm.engine.sampling.grammar_masks import BatchMasks, MaskFiller

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
OPEN = 'root ::= item (", " item)*\nitem ::= colour " " shape\ncolour ::= "red" | "blue"\nshape ::= "circle" | "square"'
READ = "Read this back: red circle, blue square, red circle, blue square, red circle."


@pytest.fixture(scope="module")
def spec():
    with Engine(EngineConfig(device="cpu", num_blocks=128, speculative_config=SPEC)) as e:
        yield e


@pytest.fixture(scope="module")
def mtp(tmp_path_factory):
    """The random Qwen3.5 with an MTP head, drafting 3 guesses a step with it."""
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    path = make_qwen3_5_checkpoint(str(tmp_path_factory.mktemp("masks_mtp") / "qwen3_5"), seed=3, mtp=True)
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", num_blocks=64, max_model_len=512,
                             speculative_config={"method": "mtp", "num_speculative_tokens": 3})) as e:
        yield e


@pytest.mark.parametrize("which", ["ngram", pytest.param("mtp", marks=pytest.mark.slow)])  # mtp: ~20 s
def test_every_fill_mode_gives_the_same_tokens_and_ahead_finds_its_masks_filled(which, request, monkeypatch):
    spec = request.getfixturevalue("spec" if which == "ngram" else "mtp")
    filler = spec.core.masks
    real_start, found = filler.start, []

    def start(seqs, drafts=None):
        ahead, masks = filler._ahead, real_start(seqs, drafts)
        if masks is not None and drafts:  # a step that verifies guesses under a grammar
            found.append(masks is ahead or masks.source is not None and masks.source[0] is ahead)
        return masks
    monkeypatch.setattr(filler, "start", start)
    params = SamplingParams(max_tokens=40 if which == "ngram" else 12, ignore_eos=True,
                            structured_outputs=SO(grammar=OPEN))
    runs, chosen = {}, filler.mode
    try:
        for mode in MaskFiller.MODES:
            filler.mode, found[:] = mode, []
            since = spec.snapshot().last_event_seq
            outs = spec.generate([Request(prompt=READ), Request(prompt="List: red circle, blue square.")],
                                 [params, params])
            events = spec.events(since)
            runs[mode] = ([o.token_ids for o in outs], [(e.allowed, e.token) for e in events
                                                       if e.kind == "constrained"], list(found))
            assert any(e.kind == "speculated" for e in events)
    finally:
        filler.mode = chosen
    assert runs["ahead"][:2] == runs["beside"][:2] == runs["sampling"][:2]
    ahead = runs["ahead"][2]
    assert len(ahead) >= 4 and sum(ahead) >= len(ahead) - 1, ahead  # all but the first found them filled ahead
    assert not any(runs["beside"][2]) and not any(runs["sampling"][2])


def test_rows_taken_from_longer_guesses_are_the_librarys_own(spec):
    """Masks filled along 4 guesses, narrowed to 2 (and to none) for the same request: bit for bit those the library
    fills along the 2 guesses (and none) itself."""
    grammars, tok = spec.intake.grammars(), spec.tokenizer
    guesses = tuple(tok.encode("red circle, blue", add_special_tokens=False))[:4]
    assert len(guesses) == 4

    class Seq:  # what the filler reads of a request
        def __init__(self, seq_id):
            self.seq_id, self.matcher, self.params = seq_id, grammars.matcher(SO(grammar=OPEN)), SamplingParams()

        def __len__(self):
            return 10 + self.matcher.consumed
    seqs = [Seq(0), Seq(1)]
    filler = MaskFiller("sampling")
    longer = filler._masks(seqs, [guesses, guesses])
    longer.fill()
    for cut in ((guesses[:2], ()), ((), guesses[:3])):
        taken = filler._masks(seqs, list(cut)).narrowed(longer)
        taken.fill()
        fresh = BatchMasks([0, 1], [s.matcher for s in seqs], list(cut), [frozenset()] * 2, [True] * 2)
        fresh.fill()
        assert taken.rows == fresh.rows and torch.equal(taken.bits, fresh.bits)
        first, _ = taken.rows[0 if cut[0] else 1]  # the rows differ along the guesses
        assert not torch.equal(taken.bits[first], taken.bits[first + 1])
    assert all(s.matcher.consumed == 0 for s in seqs)  # every walk rolled back

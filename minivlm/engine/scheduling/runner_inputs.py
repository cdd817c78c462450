"""One request's part of a step plan (a ScheduledRequest), written from what the scheduler decided for it (its tokens
[start, end), its draft, the blocks it hit and publishes): the runner's inputs for those tokens — ids, M-RoPE
positions, where its image tokens are and their rows in the encoder cache's outputs, the image spans it overlaps —
computed once here, so that the runner reads no request state."""
from minivlm.engine.scheduling.plan import ScheduledRequest
from minivlm.engine.sequence import Sequence
from minivlm.inputs.image_layout import runs


def image_runs(seq: Sequence) -> list[tuple[int, int]]:
    """[a, b) of each run of image placeholder tokens in seq's prompt (one image, or one crop of it)."""
    return runs(seq.token_types[:seq.num_prompt_tokens]) if seq.images else []


def scheduled_request(seq: Sequence, decided: dict, groups: tuple, encode: bool, whole_spans: bool) -> ScheduledRequest:
    """seq's part of the plan. decided: the scheduler's {start, end, publishes, and hits, admitted, draft, draft_at
    where set}; groups: each KV-cache group's part (coordinator.step_parts); encode: the tower encodes some of its
    images in this step; whole_spans: its image spans attend both ways (Gemma 3), so the runner gets them."""
    start, end, draft = decided["start"], decided["end"], decided.get("draft", ())
    kind = "decode" if seq.num_output_tokens > 0 and start == len(seq) - 1 else \
        "prefill" if end == len(seq) else "chunk"
    return ScheduledRequest(seq.seq_id, seq.request_id, start, end, end == len(seq), kind,
                            hits=tuple(decided.get("hits", ())), publishes=tuple(decided["publishes"]),
                            admitted=decided.get("admitted", False), encode=encode,
                            **runner_inputs(seq, start, end, draft, whole_spans), draft=draft,
                            draft_at=decided.get("draft_at", -1), groups=groups)


def runner_inputs(seq: Sequence, start: int, end: int, draft: tuple, whole_spans: bool) -> dict:
    """What the runner needs of seq's tokens [start, end) and its draft tokens after them: ids, positions, where its
    image tokens are and their rows in the encoder cache's outputs (vision key, first row, rows)."""
    image_at = tuple(i for i, t in enumerate(seq.token_types[start:end]) if t) if seq.images else ()
    spans = tuple((a, b) for a, b in image_runs(seq) if b > start and a < end) if whole_spans else ()
    return {"token_ids": tuple(seq.token_ids[start:end]) + draft, "positions": seq.positions(start, end + len(draft)),
            "spans": spans, "image_at": image_at,
            "image_rows": tuple((seq.vision_keys[i], a, n) for i, a, n in seq.image_rows(start, end))
            if image_at else ()}

"""The training tool's auxiliary targets point at the right things: a "where" answer's query position is the
token whose logits give the answer's first word, and the vision tokens labelled with a shape lie inside it."""
import random

import torch

from minivlm.inputs.processor import load_processor
from tools.scenes import COLORS, random_scene, render
from tools.train_signals import attention_loss, token_labels, where_queries
from tools.train_tiny import FAMILY, PATCH
from tests.test_tiny_model import MODEL_DIR


def test_where_queries_and_token_labels_match_the_tokens():
    processor = load_processor(MODEL_DIR, FAMILY)
    tok = processor.tokenizer
    scene = random_scene(random.Random(3), 3, ["circle", "circle", "square"], ["red", "blue", "green"])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the picture."}]},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "Where is the blue circle?"}, {"role": "assistant", "content": "top left"}]
    batch = processor(text=[processor.apply_chat_template(messages, tokenize=False)], images=[render(scene)],
                      return_tensors="pt")
    ids = batch["input_ids"]
    [(row, pos, shape, colour)] = where_queries(ids, tok("<|im_start|>assistant\n").input_ids,
                                                [[(1, 1, list(COLORS).index("blue"))]])
    assert row == 0 and tok.decode(ids[0, pos + 1:pos + 3]) == "top left"  # the second answer, not the first
    truth = token_labels(scene, batch["image_grid_thw"][0], PATCH)
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert truth.shape[0] == int((ids == image_token).sum())  # one label per merged vision token, in order
    blue = scene.shapes[1]
    centres = truth[truth[:, 5] == 1, 1:3] * torch.tensor([scene.width, scene.height])
    assert len(centres) > 0 and all(blue.x <= x < blue.x + blue.side and blue.y <= y < blue.y + blue.side
                                    for x, y in centres.tolist())
    # all attention on the asked shape's tokens costs nothing; spread over every token it costs -log(its share)
    on_shape = (ids[0] == image_token).nonzero().squeeze(1)[truth[:, 5] == 1]
    weights = torch.zeros(1, 2, ids.shape[1], ids.shape[1])
    weights[0, :, pos, on_shape] = 1 / len(on_shape)
    assert attention_loss(weights, ids, image_token, truth, [(0, pos, 1, 0)]).item() < 1e-5
    weights[0, :, pos] = 1 / ids.shape[1]
    share = len(on_shape) / ids.shape[1]
    assert abs(attention_loss(weights, ids, image_token, truth, [(0, pos, 1, 0)]).item() + torch.log(
        torch.tensor(share)).item()) < 1e-4

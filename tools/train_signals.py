"""Auxiliary training signals for the tiny Qwen3-VL (tools/train_tiny.py): dense labels for every vision token,
and where the answer to a "where" question should look. None of the heads here is shipped; they only shape the
gradients of the model that is."""
import torch
import torch.nn.functional as F

from tools.scenes import SHAPES

LABELS = 6  # per vision token: kind (3 = background), own centre x/y, its shape's centre x/y, shape index (-1)


def token_labels(scene, grid_thw, patch: int) -> torch.Tensor:
    """Per merged vision token (row-major): the index of the shape kind whose box holds its centre (3 if
    background), the token's own centre and the centre of the box it lies in (its own if background), both as
    fractions of the canvas's width and height, and the index of that shape in the scene (-1 if background)."""
    _, gh, gw = (int(v) for v in grid_thw)
    rows, cols = gh // 2, gw // 2
    sx, sy = scene.width / (gw * patch), scene.height / (gh * patch)
    labels = torch.zeros(rows, cols, LABELS)
    for r in range(rows):
        for c in range(cols):
            x, y = (c + 0.5) * 2 * patch * sx, (r + 0.5) * 2 * patch * sy
            labels[r, c] = torch.tensor([len(SHAPES), x, y, x, y, -1])
            for k, sh in enumerate(scene.shapes):
                if sh.x <= x < sh.x + sh.side and sh.y <= y < sh.y + sh.side:
                    labels[r, c] = torch.tensor([SHAPES.index(sh.kind), x, y, sh.x + sh.side / 2,
                                                 sh.y + sh.side / 2, k])
    labels[..., 1:5:2] /= scene.width
    labels[..., 2:5:2] /= scene.height
    return labels.reshape(-1, LABELS)


def where_queries(input_ids: torch.Tensor, prefix: list, asked: list) -> list:
    """(row, position, shape index, colour index) for every "where" answer of the batch: the position is the
    prefix's last token, whose logits give the answer's first word; asked[b] lists the chat's (turn, shape
    index, colour index)."""
    out = []
    for b, row in enumerate(input_ids.tolist()):
        starts = [i for i in range(len(row) - len(prefix) + 1) if row[i:i + len(prefix)] == prefix]
        out += [(b, starts[turn] + len(prefix) - 1, k, c) for turn, k, c in asked[b]]
    return out


def attention_loss(weights: torch.Tensor, input_ids, image_token_id: int, token_truth, queries) -> torch.Tensor:
    """-log of the attention mass (mean over heads) that each "where" answer puts on its shape's vision tokens:
    the decoder must find the asked shape by colour and kind, and this says which tokens those are."""
    if not queries:
        return weights.new_zeros(())
    shape_of = torch.full(input_ids.shape, -2.0, device=weights.device)  # vision tokens' shape index, in order
    shape_of[input_ids == image_token_id] = token_truth[:, 5]
    losses = []
    for b, q, k, _ in queries:
        mass = weights[b, :, q][:, shape_of[b] == k].sum(-1).mean()
        losses.append(-torch.log(mass + 1e-6))
    return torch.stack(losses).mean()


def losses_of(model, aux_head, batch, token_truth, captured, args, queries=()):
    """The answer tokens' loss and the vision tokens' auxiliary loss of one batch."""
    lm_loss = model(**batch).loss
    tokens = captured["tokens"]
    # dense per-token shape (and position) labels give the ViT a direct signal (the heads are not shipped)
    aux = F.cross_entropy(aux_head["kind"](tokens), token_truth[:, 0].long())
    if args.init:  # where the token is and where the centre of its shape is, regressed
        aux = aux + args.position_weight / args.aux_weight * F.mse_loss(aux_head["position"](tokens),
                                                                         token_truth[:, 1:5])
    inside = token_truth[:, 0] < len(SHAPES)
    if args.third_weight and inside.any():  # the row and column third of its shape's centre: a CE is sharpest at a cut
        thirds = (3 * token_truth[inside, 3:5]).floor().clamp(max=2).long()
        logits = aux_head["third"](tokens[inside]).view(-1, 2, 3)
        aux = aux + args.third_weight / args.aux_weight * F.cross_entropy(logits.reshape(-1, 3), thirds.reshape(-1))
    if args.attend_weight:
        aux = aux + args.attend_weight / args.aux_weight * attention_loss(
            captured["attention"], batch["input_ids"], model.config.image_token_id, token_truth, queries)
    if args.query_weight and queries:  # the query must carry the asked colour before attention can select by it
        rows, cols, _, colours = (torch.tensor(v, device=tokens.device) for v in zip(*queries))
        aux = aux + args.query_weight / args.aux_weight * F.cross_entropy(
            aux_head["asked_color"](captured["query_input"][rows, cols]), colours)
    return lm_loss, aux

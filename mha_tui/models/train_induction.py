"""Train the induction model (mha_tui/models/induction.py) on a CPU and save its weights.

    python -m mha_tui.models.train_induction            # the shipped weights (seed 0)
    python -m mha_tui.models.train_induction --out my.safetensors --steps 500

The data: rows of 33 distinct random tokens (a random permutation of the vocabulary, cut; the
model reads 32 and predicts each next one) in which a segment of 2..16 tokens starting
anywhere is copied to a later, random place; one row in four is a segment followed at once by
its repeat ("a b c d a b c d ..."), the shape of the sentences mha-tui shows. Inside the
repeat, the next token can only be known by finding where the current token occurred before
and copying what followed it: an induction head.

Two phases (`--solo-steps`, then the rest of `--steps`):

1. Only head 0 of each layer at work (the other heads' slices of the input to W_O zeroed by
   a forward pre-hook) and the loss on the copied tokens only. With the loss on every token
   from the start, 2,500 steps learned only that a token seen before is not the next one (the
   rows' tokens are distinct) and formed no induction head; on the copied tokens one formed
   within 250 steps. With every head at work, every head of a layer learned the same thing,
   and removing one head changed nothing.
2. Every head at work, the loss the mean over every token plus the mean over the copied ones:
   the other heads learn what else helps, the copying stays sharp.

Seeded: the same seed gives the same weights on the same torch build and thread count (one
thread, `torch.set_num_threads(1)`).

Every `--every` steps it prints, on held-out rows made with another seed, each head's
previous-token score (mean weight on the key just before the query) and induction score (mean
weight, over the queries of the repeat, on the key just after the query token's first
occurrence), and the next-token accuracy on the repeated half. Plain torch, like the model: no
mha-tui inside.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mha_tui.models.induction import WEIGHTS, AttentionOnlyTransformer, InductionConfig

TRAIN_SEED = 0
EVAL_SEED = 1


def repeated_rows(generator: torch.Generator, rows: int, config: InductionConfig,
                  immediate: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Training rows of max_seq_len + 1 distinct random tokens (the model reads the first
    max_seq_len and predicts each next one) with one segment copied later in the row. One row
    in `immediate` has the copy right after the segment, from position 0; in the others the
    segment starts anywhere (uniformly, so that a first occurrence, where the previous-token
    head is needed, can sit late in the row too), is 2 to 16 tokens long as room allows, and
    its copy starts anywhere after it. Returns the ids (B, T + 1) and which tokens are
    predictable by copying (B, T + 1): the copy's second token on."""
    T, vocab = config.max_seq_len + 1, config.vocab_size
    ids = torch.stack([torch.randperm(vocab, generator=generator)[:T] for _ in range(rows)])  # (B, T+1)
    copied = torch.zeros(rows, T, dtype=torch.bool)  # (B, T+1)
    longest = config.max_seq_len // 2

    def uniform(low: int, high: int) -> int:  # low .. high, both included
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    for row in range(rows):
        if row % immediate == 0:
            length = uniform(2, longest)
            first, second = 0, length  # the segment, then at once its repeat
        else:
            first = uniform(0, T - 4)
            length = uniform(2, min(longest, (T - first) // 2))
            second = uniform(first + length, T - length)
        ids[row, second : second + length] = ids[row, first : first + length]
        copied[row, second + 1 : second + length] = True
    return ids, copied


def repeated_halves(generator: torch.Generator, rows: int, length: int, vocab: int) -> torch.Tensor:
    """Held-out rows: `length` distinct random tokens, then the same tokens again. (B, 2 * length)"""
    segment = torch.stack([torch.randperm(vocab, generator=generator)[:length] for _ in range(rows)])
    return torch.cat([segment, segment], dim=1)  # (B, 2 * length)


def attention_weights(model: AttentionOnlyTransformer, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention weights (B, h, T, T), recomputed from the inputs its forward saw."""
    inputs: list[torch.Tensor] = []
    hooks = [block.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
             for block in model.blocks]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    weights = []
    for block, x in zip(model.blocks, inputs, strict=True):
        attn = block.attn
        B, T, C = x.shape  # (B, T, C)
        Q = attn.W_Q(x).view(B, T, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B, h, T, d_h)
        K = attn.W_K(x).view(B, T, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B, h, T, d_h)
        scores = Q @ K.transpose(-2, -1) / attn.head_dim**0.5 + attn.causal_mask[:T, :T]  # (B, h, T, T)
        weights.append(F.softmax(scores, dim=-1))  # (B, h, T, T)
    return weights


def evaluate(model: AttentionOnlyTransformer, ids: torch.Tensor) -> dict:
    """Scores on repeated halves (B, 2 * length): per head previous-token and induction, and accuracy."""
    length = ids.shape[1] // 2
    model.eval()
    with torch.no_grad():
        logits = model(ids)  # (B, 2L, vocab)
    # Predictions at positions L .. 2L-2 are for the tokens L+1 .. 2L-1: the repeat after its first token.
    predicted = logits[:, length : 2 * length - 1].argmax(-1)  # (B, L-1)
    accuracy = (predicted == ids[:, length + 1 :]).float().mean().item()
    queries = torch.arange(1, 2 * length)  # every query with a previous token
    repeat = torch.arange(length, 2 * length)  # the repeat's queries; first occurrence at q - L
    previous, induction = [], []
    for weights in attention_weights(model, ids):
        previous.append(weights[:, :, queries, queries - 1].mean(dim=(0, 2)).tolist())  # (h,)
        induction.append(weights[:, :, repeat, repeat - length + 1].mean(dim=(0, 2)).tolist())  # (h,)
    model.train()
    return {"accuracy": accuracy, "previous": previous, "induction": induction}


def describe(scores: dict) -> str:
    best_previous = max(max(layer) for layer in scores["previous"])
    best_induction = max(max(layer) for layer in scores["induction"])
    return (f"previous-token {best_previous:.3f}  induction {best_induction:.3f}  "
            f"repeat accuracy {scores['accuracy']:.3f}")


def solo(model: AttentionOnlyTransformer) -> list[torch.utils.hooks.RemovableHandle]:
    """Only head 0 of each layer at work: the other heads' slices of the input to W_O zeroed
    (forward pre-hooks; the model's code is unchanged)."""
    head_dim = model.blocks[0].attn.head_dim

    def first_head_only(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        context = args[0].clone()  # (B, T, h * d_h): heads side by side
        context[..., head_dim:] = 0  # every head but head 0
        return (context,)

    return [block.attn.W_O.register_forward_pre_hook(first_head_only) for block in model.blocks]


def train(steps: int, batch: int, lr: float, seed: int, every: int, out: Path,
          immediate: int = 4, solo_steps: int = 0) -> dict:
    """solo_steps: for the first steps only head 0 of each layer works and the loss is on the
    copied tokens only; then every head works and the loss is the mean over every token plus
    the mean over the copied tokens."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = InductionConfig()
    model = AttentionOnlyTransformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.05)
    data = torch.Generator().manual_seed(seed)
    held_out = repeated_halves(torch.Generator().manual_seed(EVAL_SEED), 256, 12, config.vocab_size)
    hooks = solo(model) if solo_steps else []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        if step == solo_steps + 1:
            for hook in hooks:
                hook.remove()
            hooks = []
        ids, copied = repeated_rows(data, batch, config, immediate)  # (B, T), (B, T)
        logits = model(ids[:, :-1])  # (B, T-1, vocab)
        losses = F.cross_entropy(logits.reshape(-1, config.vocab_size), ids[:, 1:].reshape(-1),
                                 reduction="none")  # (B * (T-1),)
        on_copies = losses[copied[:, 1:].reshape(-1)].mean()
        # Solo: only the tokens a copy can predict (the rest is noise to the gradient); then
        # every token, and the copied ones once more, so that the copying stays sharp.
        loss = on_copies if hooks else losses.mean() + on_copies
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % every == 0 or step == steps:
            scores = evaluate(model, held_out)
            print(f"step {step:5d}  {time.perf_counter() - started:6.0f} s  loss {loss.item():.3f}  "
                  f"{describe(scores)}", flush=True)
            save(model, out)
    scores = evaluate(model, held_out)
    for layer, (previous, induction) in enumerate(zip(scores["previous"], scores["induction"], strict=True)):
        for head, (p, i) in enumerate(zip(previous, induction, strict=True)):
            print(f"layer {layer} head {head}: previous-token {p:.3f}  induction {i:.3f}")
    print(f"trained in {time.perf_counter() - started:.0f} s; weights in {out} ({out.stat().st_size} bytes)")
    return scores


def save(model: AttentionOnlyTransformer, out: Path) -> None:
    from safetensors.torch import save_file

    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(out), metadata={"trained_by": "mha_tui.models.train_induction"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=TRAIN_SEED)
    parser.add_argument("--every", type=int, default=250, help="print scores and save every N steps")
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    parser.add_argument("--immediate", type=int, default=4,
                        help="one row in N holds a segment followed at once by its repeat")
    parser.add_argument("--solo-steps", type=int, default=800,
                        help="first steps with only head 0 of each layer, loss on the copied tokens")
    args = parser.parse_args(argv)
    train(args.steps, args.batch, args.lr, args.seed, args.every, args.out, args.immediate,
          args.solo_steps)


if __name__ == "__main__":
    main()

"""The model trained by this repository (mha_tui/models): its shipped weights have a
previous-token head and an induction head, and copy a repeat, on sentences never trained on.

These tests check the shipped weights' behaviour on held-out data (another seed than
training's and than the training script's own evaluation), the training script's determinism
on a few steps, that the script run as documented gives the shipped weights bit for bit (about
a minute on one quiet core), and the package's file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mha_tui.models.induction import WEIGHTS, AttentionOnlyTransformer, InductionConfig, load_trained
from mha_tui.models.train_induction import EVAL_SEED, TRAIN_SEED, evaluate, repeated_halves, train

HELD_OUT_SEED = 2026  # neither the training seed (0) nor the script's evaluation seed (1)


@pytest.fixture(scope="module")
def model() -> AttentionOnlyTransformer:
    return load_trained()


def test_weights_are_small_safetensors_in_the_package() -> None:
    assert WEIGHTS.suffix == ".safetensors"
    assert WEIGHTS.stat().st_size < 1_000_000
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text("utf-8")
    assert '"models/*.safetensors"' in pyproject  # shipped as package data
    assert HELD_OUT_SEED not in (TRAIN_SEED, EVAL_SEED)


@pytest.mark.parametrize("length", [5, 8, 12, 16])
def test_held_out_repeats_have_the_two_heads_and_are_copied(model: AttentionOnlyTransformer,
                                                            length: int) -> None:
    """Scores recomputed in plain torch (the training script's evaluate) on 200 rows of
    `length` random tokens then the same tokens again, made with a seed never trained on."""
    rows = repeated_halves(torch.Generator().manual_seed(HELD_OUT_SEED + length), 200, length,
                           InductionConfig().vocab_size)
    scores = evaluate(model, rows)
    assert max(scores["previous"][0]) >= 0.9  # a layer-0 head attends to the previous token
    assert max(scores["induction"][1]) >= 0.9  # a layer-1 head to the token after the last copy
    assert scores["accuracy"] > 0.95  # the repeat's next tokens, predicted


def test_training_is_seeded(tmp_path: Path) -> None:
    """Three steps twice with the same seed give the same tensors; another seed does not."""
    from safetensors.torch import load_file

    runs = []
    for seed, name in ((0, "a"), (0, "b"), (1, "c")):
        out = tmp_path / f"{name}.safetensors"
        train(steps=3, batch=8, lr=3e-3, seed=seed, every=3, out=out)
        runs.append(load_file(str(out)))
    a, b, c = runs
    assert a.keys() == b.keys() == set(AttentionOnlyTransformer().state_dict())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.slow
def test_the_training_script_reproduces_the_shipped_weights(tmp_path: Path) -> None:
    """`python -m mha_tui.models.train_induction` (its defaults: seed 0, one thread) writes
    the very tensors the package ships: the README's "how to train it again" is true."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    out = tmp_path / "again.safetensors"
    subprocess.run([sys.executable, "-m", "mha_tui.models.train_induction", "--out", str(out)],
                   check=True, capture_output=True, timeout=1200)
    again, shipped = load_file(str(out)), load_file(str(WEIGHTS))
    assert again.keys() == shipped.keys()
    assert [k for k in shipped if not torch.equal(again[k], shipped[k])] == []

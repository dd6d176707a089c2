"""The `--hf` rows of the benchmark, at GPT-2 small's sizes, offline.

    .venv/bin/python benchmarks/hf_rows.py build DIR     # writes the model, prints its sentences
    .venv/bin/python benchmarks/hf_rows.py forward DIR   # the model's own forward, output_attentions

`build` saves a GPT-2 with GPT-2 small's shapes (12 layers, C 768, h 12, 1024 positions;
random weights, the tests' small byte-level tokenizer, so nothing is downloaded) and prints
a JSON object: a sentence of 1,000 tokens and one of 1,100 (more than the model takes).
`forward` loads it the way `--hf` does (eager attention) and runs its own forward once on the
1,000 tokens with `output_attentions=True`: the memory a user needs to see every layer's
weights without mha-tui, the reference the issue's memory target is stated against.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORD = "the"  # one token of the tests' tokenizer, with or without its leading space


def _words(tokenizer, tokens: int) -> int:
    """How many words make `tokens` tokens (the tokenizer may add one of its own)."""
    extra = len(tokenizer(" ".join([WORD] * tokens))["input_ids"]) - tokens
    words = tokens - extra
    count = len(tokenizer(" ".join([WORD] * words))["input_ids"])
    if count != tokens:
        raise SystemExit(f"hf_rows: {words} words gave {count} tokens, not {tokens}")
    return words


def _sentence(tokenizer, tokens: int) -> str:
    return " ".join([WORD] * _words(tokenizer, tokens))


def build(directory: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, str(ROOT))
    from tests.hf_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=1024, n_embd=768, n_layer=12,
                        n_head=12, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    print(json.dumps({"fits": _sentence(tokenizer, 1000), "too_long": _sentence(tokenizer, 1100)}))


def forward(directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                 attn_implementation="eager").eval()
    ids = tokenizer(_sentence(tokenizer, 1000), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    assert len(out.attentions) == 12


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    {"build": build, "forward": forward}[sys.argv[1]](Path(sys.argv[2]))

"""The `--hf` rows at the sizes learners download: Llama-3.2-1B, Llama-3.2-3B, Llama-3-8B and
(optional, `--only hf_70b`) Llama-3-70B.

    .venv/bin/python benchmarks/hf_shapes.py build NAME DIR   # the checkpoint, if not there yet
    .venv/bin/python benchmarks/hf_shapes.py sentence DIR     # 12 tokens of its tokenizer
    .venv/bin/python benchmarks/hf_shapes.py forward DIR      # transformers' own bf16 forward

`build` writes a checkpoint of the published shapes (config.json as the model's, every tensor
of the shape and name transformers saves) in bfloat16 safetensors, with random weights
(1B, 3B: N(0, 0.02), norms 1), or for the 8B and 70B as a sparse file (its weights all zero, holes on
disk: 16 GB or 141 GB that take no room), and the tests' small byte-level tokenizer (nothing is
downloaded). The safetensors file is written tensor by tensor, so that building takes one
tensor's memory. DIR is a cache (benchmarks/bench.py puts it under ~/.cache/mha-tui-bench);
never commit it.

`forward` is the reference the issue states its memory target against: the checkpoint loaded
by transformers as a user would (`dtype="auto"`, eager attention) and one forward on the 12
tokens with `output_attentions=True`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 12

# config.json's sizes as published (meta-llama/Llama-3.2-1B, Llama-3.2-3B, Meta-Llama-3-8B,
# Meta-Llama-3-70B).
_LLAMA3 = dict(vocab_size=128256, rms_norm_eps=1e-5, num_key_value_heads=8, bos_token_id=0,
               eos_token_id=0)
_SCALED = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
           "high_freq_factor": 4.0, "low_freq_factor": 1.0,
           "original_max_position_embeddings": 8192}
SHAPES: dict[str, dict] = {
    "llama-3.2-1b": dict(_LLAMA3, hidden_size=2048, intermediate_size=8192,
                         num_attention_heads=32, num_hidden_layers=16, head_dim=64,
                         max_position_embeddings=131072, tie_word_embeddings=True,
                         rope_parameters=_SCALED),
    "llama-3.2-3b": dict(_LLAMA3, hidden_size=3072, intermediate_size=8192,
                         num_attention_heads=24, num_hidden_layers=28, head_dim=128,
                         max_position_embeddings=131072, tie_word_embeddings=True,
                         rope_parameters=_SCALED),
    "llama-3-8b": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336,
                       num_attention_heads=32, num_hidden_layers=32, head_dim=128,
                       max_position_embeddings=8192, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama-3-70b": dict(_LLAMA3, hidden_size=8192, intermediate_size=28672,
                        num_attention_heads=64, num_hidden_layers=80, head_dim=128,
                        max_position_embeddings=8192, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
}
SPARSE = {"llama-3-8b", "llama-3-70b"}  # zero weights, a sparse file (15 GB, 141 GB)
# Written in shards of 5 GB, as published: one 141 GB file could not even be mapped (torch
# maps a safetensors file whole, and Linux refuses a private mapping larger than the memory
# and swap: "unable to mmap ... Cannot allocate memory").
SHARDED = {"llama-3-70b": 5 * 10**9}


def build(name: str, directory: Path) -> None:
    stamp = directory / "built.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == SHAPES[name]:
        return
    sys.path.insert(0, str(ROOT))
    from tests.hf_models import save_llama_shaped

    for old in directory.glob("model*.safetensors*"):
        old.unlink()
    save_llama_shaped(directory, SHAPES[name], sparse=name in SPARSE,
                      shard_bytes=SHARDED.get(name))
    stamp.write_text(json.dumps(SHAPES[name]))


def sentence(directory: Path) -> str:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hf_rows import _sentence

    return _sentence(AutoTokenizer.from_pretrained(directory, local_files_only=True), TOKENS)


def forward(directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype="auto",
                                                 attn_implementation="eager").eval()
    ids = tokenizer(sentence(directory), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    assert len(out.attentions) == model.config.num_hidden_layers
    assert out.attentions[0].dtype == torch.bfloat16


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    command = sys.argv[1]
    if command == "build":
        build(sys.argv[2], Path(sys.argv[3]))
    elif command == "sentence":
        print(sentence(Path(sys.argv[2])))
    else:
        forward(Path(sys.argv[2]))

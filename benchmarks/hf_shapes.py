"""The `--hf` rows at the sizes learners download: Llama-3.2-1B, Llama-3.2-3B and Llama-3-8B.

    .venv/bin/python benchmarks/hf_shapes.py build NAME DIR   # the checkpoint, if not there yet
    .venv/bin/python benchmarks/hf_shapes.py sentence DIR     # 12 tokens of its tokenizer
    .venv/bin/python benchmarks/hf_shapes.py forward DIR      # transformers' own bf16 forward

`build` writes a checkpoint of the published shapes (config.json as the model's, every tensor
of the shape and name transformers saves) in bfloat16 safetensors, with random weights
(1B, 3B: N(0, 0.02), norms 1), or for the 8B as a sparse file (its weights all zero, holes on
disk: 16 GB that take no room), and the tests' small byte-level tokenizer (nothing is
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
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 12

# config.json's sizes as published (meta-llama/Llama-3.2-1B, Llama-3.2-3B, Meta-Llama-3-8B).
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
}
SPARSE = {"llama-3-8b"}  # zero weights, a sparse file


def _tensors(config) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor save_pretrained writes for this config, in its order (tied ones once)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    seen: set[int] = set()
    names = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen or (config.tie_word_embeddings and name == "lm_head.weight"):
            continue
        seen.add(id(param))
        names.append((name, tuple(param.shape)))
    return names


def build(name: str, directory: Path) -> None:
    stamp = directory / "built.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == SHAPES[name]:
        return
    import torch
    from transformers import LlamaConfig

    sys.path.insert(0, str(ROOT))
    from tests.hf_models import tiny_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**SHAPES[name])
    config.dtype = torch.bfloat16
    config.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    tensors = _tensors(config)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, shape in tensors:
        size = 2
        for extent in shape:
            size *= extent
        header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    generator = torch.Generator().manual_seed(0)
    with open(directory / "model.safetensors", "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        start = out.tell()
        if name in SPARSE:
            out.truncate(start + offset)  # holes: zeros that take no disk
        else:
            for key, shape in tensors:
                if key.endswith("norm.weight"):
                    tensor = torch.ones(shape, dtype=torch.bfloat16)
                else:
                    tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
                tensor.view(torch.int16).numpy().tofile(out)
                del tensor
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

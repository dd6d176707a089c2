"""Tiny Hugging Face models and tokenizers built offline for the --hf tests.

Nothing here touches the network: the tokenizer is trained on a few sentences with
`tokenizers`, the model is a GPT-2 config with a fixed seed, both saved with save_pretrained.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SENTENCES = [
    "The cat sat on the mat.",
    "The dog sat on the log.",
    "A cat and a dog were friends, and the cat liked the mat.",
    "Café, naïve, 😀: bytes that form text and bytes that do not.",
]
EOS = "<|endoftext|>"


def tiny_tokenizer():
    """A byte-level BPE tokenizer (GPT-2's kind) trained on SENTENCES."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 3, vocab_size=300, min_frequency=1, special_tokens=[EOS],
                            show_progress=False)
    return GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOS, eos_token=EOS,
                             unk_token=EOS)


def tiny_gpt2(vocab_size: int, *, n_layer: int = 3, n_embd: int = 16, n_head: int = 4,
              n_positions: int = 64, seed: int = 0):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def save_tiny_gpt2(directory: Path, *, with_tokenizer: bool = True, **sizes: int) -> Path:
    tokenizer = tiny_tokenizer()
    model = tiny_gpt2(len(tokenizer), **sizes)
    model.save_pretrained(directory)
    if with_tokenizer:
        tokenizer.save_pretrained(directory)
    return directory


def save_tiny_mamba(directory: Path) -> Path:
    """A causal LM whose layers hold no attention at all (a state-space mixer)."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=len(tokenizer), hidden_size=16, state_size=4,
                         num_hidden_layers=2, expand=2, conv_kernel=2)
    MambaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def hub_cache_layout(cache: Path, repo_id: str, model_dir: Path,
                     revision: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """Lay model_dir out in cache the way the hub does: blobs, snapshots/<hash>, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in model_dir.iterdir():
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def save_llama_shaped(directory: Path, sizes: dict, *, sparse: bool, seed: int = 0,
                      shard_bytes: int | None = None) -> Path:
    """A Llama checkpoint of the given config.json sizes in bfloat16 safetensors, beside
    tiny_tokenizer, written tensor by tensor (building it takes one tensor's memory):
    random weights (N(0, 0.02), norms 1), or, `sparse`, every weight zero as a sparse file
    (holes on disk: a checkpoint of tens of GB that takes no room). shard_bytes: in shards of
    at most that size with their model.safetensors.index.json, as save_pretrained and the
    published big checkpoints (Llama-3-70B: 30 files of about 5 GB) lay them out."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**sizes)
    config.dtype = torch.bfloat16
    config.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Every tensor save_pretrained writes, in its order, tied ones once.
    seen: set[int] = set()
    tensors: list[tuple[str, tuple[int, ...], int]] = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen or (config.tie_word_embeddings and name == "lm_head.weight"):
            continue
        seen.add(id(param))
        tensors.append((name, tuple(param.shape), 2 * param.numel()))
    shards: list[list[tuple[str, tuple[int, ...], int]]] = [[]]
    for tensor in tensors:
        if shard_bytes and shards[-1] and sum(t[2] for t in shards[-1]) + tensor[2] > shard_bytes:
            shards.append([])
        shards[-1].append(tensor)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    generator = torch.Generator().manual_seed(seed)
    for name, shard in zip(names, shards, strict=True):
        _write_safetensors(directory / name, shard, sparse, generator)
    if len(shards) > 1:
        weight_map = {key: name for name, shard in zip(names, shards, strict=True)
                      for key, _, _ in shard}
        index = {"metadata": {"total_size": sum(t[2] for t in tensors)}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory


def _write_safetensors(file: Path, tensors: list[tuple[str, tuple[int, ...], int]],
                       sparse: bool, generator) -> None:
    import json
    import struct

    import torch

    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, shape, size in tensors:
        header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(file, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        start = out.tell()
        if sparse:
            out.truncate(start + offset)  # holes: zeros that take no disk
            return
        for key, shape, _ in tensors:
            if key.endswith("norm.weight"):
                tensor = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
            tensor.view(torch.int16).numpy().tofile(out)
            del tensor

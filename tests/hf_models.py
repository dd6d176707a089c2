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

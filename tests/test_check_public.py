"""`mha-tui check` never fails a correct module it did not write (issue 18): attention
modules as their authors wrote them (tests/fixtures/public/: nanoGPT with and without
flash, minGPT, timm's ViT Attention fused and manual, Hugging Face's LlamaAttention and
MistralAttention, Meta's Llama 2 reference Attention; each file says where it was copied
from, under which licence,
and what glue is ours) are "equivalent" with the flags their design calls for, and each
with one planted bug is "NOT equivalent" at the planted line.

The planted copy is the fixture with one line's text replaced, written to a temporary folder.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui.cli import app

PUBLIC = Path(__file__).parent / "fixtures" / "public"
runner = CliRunner()

# (file, class, options): the sizes, and what each design is (GQA + rotary, bidirectional).
MODULES = {
    "nanogpt flash": ("nanogpt.py", "FlashAttention", ["-H", "2", "-C", "8"]),
    "nanogpt manual": ("nanogpt.py", "SlowAttention", ["-H", "2", "-C", "8"]),
    "mingpt": ("mingpt.py", "MinGPTAttention", ["-H", "2", "-C", "8"]),
    "timm fused": ("timm_attention.py", "FusedAttention",
                   ["-H", "2", "-C", "8", "--init", "dim=8", "--no-causal"]),
    "timm manual": ("timm_attention.py", "ManualAttention",
                    ["-H", "2", "-C", "8", "--init", "dim=8", "--no-causal"]),
    # timm's own class, its `dim` filled with C by name as embed_dim is: no --init needed.
    "timm as written": ("timm_attention.py", "Attention", ["-H", "2", "-C", "8", "--no-causal"]),
    "hf llama": ("hf_llama.py", "HFLlamaAttention", ["-H", "4", "-C", "16", "--expect", "rotary"]),
    "hf mistral": ("hf_mistral.py", "HFMistralAttention",
                   ["-H", "4", "-C", "16", "--expect", "rotary", "--window", "2"]),
    "meta llama": ("meta_llama.py", "MetaLlamaAttention",
                   ["-H", "4", "-C", "16", "--init", "dim=16", "--init", "n_heads=4",
                    "--expect", "rotary"]),
}

# name -> (the line's text, what replaces it, the diagnosis kind)
PLANTED = {
    "nanogpt flash": ("is_causal=True)", "is_causal=False)", "mask_missing"),
    "nanogpt manual": ("* (1.0 / math.sqrt(k.size(-1)))", "* (1.0 / k.size(-1))",
                       "scaled_by_d_h"),
    "mingpt": ("att = F.softmax(att, dim=-1)", "att = F.softmax(att, dim=-2)",
               "softmax_wrong_axis"),
    "timm fused": ("is_causal=is_causal,", "is_causal=True,", None),
    "timm manual": ("attn = attn.softmax(dim=-1)", "attn = attn.softmax(dim=-2)",
                    "softmax_wrong_axis"),
    "hf llama": ("value_states = repeat_kv(value, module.num_key_value_groups)",
                 "value_states = value.repeat(1, module.num_key_value_groups, 1, 1)",
                 "kv_repeat_order"),
    "hf mistral": ("q_embed = (q * cos) + (rotate_half(q) * sin)",
                   "q_embed = (q * cos) - (rotate_half(q) * sin)", None),
    "meta llama": ("scores = F.softmax(scores.float(), dim=-1)",
                   "scores = F.softmax(scores.float(), dim=-2)", "softmax_wrong_axis"),
}


def statement(path: Path, line: int) -> int:
    """The first line of the innermost statement holding `line` (a call over several lines
    is named by its first)."""
    found = line
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.ClassDef |
                                                          ast.If | ast.For | ast.While | ast.With):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                found = node.lineno
    return found


def check(path: Path, cls: str, options: list[str]) -> tuple[int, dict]:
    result = runner.invoke(app, ["check", f"{path}:{cls}", "--format", "json", *options])
    assert result.exit_code in (0, 1, 3), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("name", MODULES)
def test_a_public_module_as_written_is_equivalent(name: str) -> None:
    file, cls, options = MODULES[name]
    code, data = check(PUBLIC / file, cls, options)
    assert code == 0, data["diagnosis"]
    assert data["equivalent"] and data["diagnosis"] is None
    assert all(s["ok"] is not False for s in data["stages"])


@pytest.mark.parametrize("name", PLANTED)
def test_a_public_module_with_one_planted_bug_is_caught_at_its_line(tmp_path: Path,
                                                                    name: str) -> None:
    file, cls, options = MODULES[name]
    old, new, kind = PLANTED[name]
    lines = (PUBLIC / file).read_text().splitlines()
    (at,) = [i + 1 for i, line in enumerate(lines) if old in line]
    lines[at - 1] = lines[at - 1].replace(old, new)
    path = tmp_path / file
    path.write_text("\n".join(lines) + "\n")
    code, data = check(path, cls, options)
    assert code == 1, data
    assert data["diagnosis"]["line"] == statement(path, at), data["diagnosis"]
    if kind is not None:
        assert data["diagnosis"]["kind"] == kind, data["diagnosis"]


def test_a_wrong_rotary_base_in_meta_llama_is_named() -> None:
    """Meta's precompute_freqs_cis with theta 500: named, at the line that turns Q."""
    file, cls, options = MODULES["meta llama"]
    code, data = check(PUBLIC / file, cls, [*options, "--rotary-base", "500"])
    assert code == 1
    assert data["diagnosis"]["kind"] == "rotary_base"
    assert data["diagnosis"]["message"].startswith("rotary base 10000 where 500 was expected")


def test_meta_llamas_division_by_sqrt_d_h_is_the_scale_stage(tmp_path: Path) -> None:
    """Meta's KV cache is written with `cache_k[:bsz, ...] = xk` (ops no rule places) before
    the scores; that is no reason to call `scores / math.sqrt(self.head_dim)` an unknown op:
    it is the scale, judged, and a wrong one is caught at its line."""
    file, cls, options = MODULES["meta llama"]
    _, data = check(PUBLIC / file, cls, options)
    kinds = [s["kind"] for s in data["stages"]]
    assert kinds[kinds.index("scores") + 1] == "scale", kinds
    (scale,) = [s for s in data["stages"] if s["kind"] == "scale"]
    assert scale["ok"] is True and "1/sqrt(d_h)" in scale["checked"]
    text = (PUBLIC / file).read_text()
    old = "/ math.sqrt(self.head_dim)"
    assert text.count(old) == 1
    path = tmp_path / file
    path.write_text(text.replace(old, "* math.sqrt(self.head_dim)"))
    code, data = check(path, cls, options)
    assert code == 1
    assert data["diagnosis"]["kind"] == "scale_inverted", data["diagnosis"]
    (at,) = [i + 1 for i, line in enumerate(text.splitlines()) if old in line]
    assert data["diagnosis"]["line"] == at


def test_every_copy_says_where_it_comes_from_and_its_licence() -> None:
    for path in PUBLIC.glob("*.py"):
        if path.name == "__init__.py":
            continue
        head = path.read_text()[:2500]
        assert "https://github.com/" in head, path
        assert "Licen" in head or "licence" in head, path
        assert "glue (ours" in path.read_text(), path

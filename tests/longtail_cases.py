"""The configurations of issue 30: public attention modules of 2024-26 in their authors'
styles (tests/fixtures/longtail/), each with the options a learner would give and what a
right answer is: the mechanisms explain should name, whether check should call it
equivalent, and the words its verdict should use (the mechanism, never a generic op).

`python -m tests.longtail_cases` measures today's state on every configuration: explained,
anonymous `op` stages, the verdict and its reason; "fully staged" is explained with no `op`
stage, "fully good" is fully staged, judged as expected, with the expected words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
LONGTAIL = FIXTURES / "longtail"


@dataclass(frozen=True)
class Case:
    ref: str  # FILE.py:Class under tests/fixtures/
    equivalent: bool  # what check should say with these options
    says: tuple[str, ...] = ()  # words the verdict should use (its reference or its reason)
    kinds: tuple[str, ...] = ()  # stage kinds explain should show
    causal: bool = True
    expect: dict = field(default_factory=dict)  # pipeline.Expect's fields
    init: tuple[tuple[str, int], ...] = ()  # --init NAME=VALUE
    embed_dim: int = 16
    heads: int = 4
    library: str = "torch"


ROTARY = {"rotary": True}


def rotary(base: float) -> dict:
    return {"rotary": True, "rotary_base": base}


CASES: dict[str, Case] = {
    "torchtune rotary, --expect rotary": Case(
        "longtail/torchtune_rope.py:TorchtuneAttention", True, ("rotary", "interleaved", "500000"),
        ("rotary",), expect={"rotary": True, "rotary_base": 500000.0}),
    "torchtune rotary": Case(
        "longtail/torchtune_rope.py:TorchtuneAttention", False, ("rotary", "500000"), ("rotary",)),
    "gpt-fast, --expect rotary": Case(
        "longtail/gpt_fast.py:Attention", True, ("rotary", "interleaved"), ("rotary", "kv_repeat"),
        expect=ROTARY),
    "gpt-fast": Case("longtail/gpt_fast.py:Attention", False, ("rotary",), ("rotary",)),
    "ESM-2, --expect rotary": Case(
        "longtail/esm.py:ESM2Attention", True, ("rotary",), ("rotary",), causal=False,
        expect=ROTARY),
    "ESM-1b (q *= scaling)": Case("longtail/esm.py:ESM1bAttention", True, (), ("scale",),
                                  causal=False),
    "litgpt partial rotary, --expect rotary": Case(
        "longtail/litgpt_rope.py:CausalSelfAttention", True, ("rotary", "partial"), ("rotary",),
        expect=ROTARY),
    "gpt-oss, --expect rotary": Case(
        "longtail/hf_installed.py:GptOssSelfAttention", False, ("sink",), ("rotary", "sinks"),
        expect=rotary(150000.0)),
    "Gemma 2, --expect rotary": Case(
        "longtail/hf_installed.py:Gemma2SelfAttention", False, ("soft-cap",),
        ("rotary", "softcap"), expect=ROTARY),
    "soft-capping alone": Case("mechanisms/softcap.py:Gemma2Attention", False, ("soft-cap",),
                               ("softcap",)),
    "Cohere, --expect rotary": Case(
        "longtail/hf_installed.py:CohereSelfAttention", True, ("rotary", "interleaved"),
        ("rotary",), expect=rotary(500000.0)),
    "Cohere": Case("longtail/hf_installed.py:CohereSelfAttention", False, ("rotary",),
                   ("rotary",)),
    "Cohere q/k LayerNorm, --expect rotary": Case(
        "longtail/hf_installed.py:CohereQKNormSelfAttention", False, ("LayerNorm", "q"),
        ("norm", "rotary"), expect=rotary(500000.0)),
    "Qwen3, --expect rotary": Case(
        "longtail/hf_installed.py:Qwen3SelfAttention", False, ("RMSNorm", "per head"),
        ("norm", "rotary"), expect=rotary(1000000.0)),
    "OLMo2, --expect rotary": Case(
        "longtail/hf_installed.py:Olmo2SelfAttention", False, ("RMSNorm",),
        ("norm", "rotary"), expect=rotary(500000.0)),
    "nanochat F.rms_norm, --expect rotary": Case(
        "longtail/nanochat_attn.py:CausalSelfAttention", False, ("RMSNorm",),
        ("norm", "rotary"), expect=ROTARY),
    "Llama 3 rope scaling, --expect rotary": Case(
        "longtail/hf_installed.py:Llama3ScaledSelfAttention", True, ("rotary", "factor 8"),
        ("rotary",), expect=rotary(500000.0), embed_dim=64),
    "YaRN, --expect rotary": Case(
        "longtail/hf_installed.py:YarnSelfAttention", True, ("rotary", "factor 4", "YaRN"),
        ("rotary",), expect=rotary(1000000.0), embed_dim=64),
    "open_clip cosine attention": Case(
        "longtail/open_clip_attn.py:Attention", False, ("cosine",), ("cosine",), causal=False),
    "open_clip scaled dot product": Case(
        "longtail/open_clip_attn.py:ScaledDotAttention", True, (), ("project", "w_o"),
        causal=False),
    "open_clip in_proj_weight.chunk(3)": Case(
        "longtail/open_clip_attn.py:ChunkedWeightAttention", True, (), ("project", "w_o"),
        causal=False),
    "Whisper F.linear(x, weight.to(dtype))": Case(
        "longtail/whisper_attn.py:MultiHeadAttention", True, (), ("project", "w_o"),
        init=(("n_state", 16),)),
    "DeBERTa-v3 c2p/p2c": Case(
        "longtail/hf_installed.py:DebertaV2SelfAttention", False, ("relative position",),
        ("pos_bias",), causal=False),
    "SAM decomposed relative positions": Case(
        "longtail/sam_attn.py:SamAttention", False, ("relative position",), ("pos_bias",),
        causal=False),
    "T5 buckets": Case("longtail/hf_installed.py:T5SelfAttention", False,
                       ("relative position",), ("pos_bias",), causal=False),
    "differential attention (unilm)": Case(
        "longtail/diff_attn.py:MultiheadDiffAttn", False, ("differential",), ("differential",)),
    "DiffLlama": Case("longtail/hf_installed.py:DiffLlamaSelfAttention", False,
                      ("differential",), ("differential",), expect=ROTARY),
    "labml sequence-first einsum": Case("longtail/labml_mha.py:LabmlSelfAttention", True,
                                        init=(("heads", 4),)),
    "pbloem former index_put mask": Case("longtail/former_attn.py:SelfAttention", True, (),
                                         ("mask",), init=(("emb", 16), ("heads", 4))),
    "picoGPT NumPy": Case("longtail/picogpt_attn.py:PicoGPTAttention", True, (),
                          ("project", "w_o"), library="numpy"),
    "linear attention": Case("longtail/linear_attn.py:AttentionLayer", False,
                             ("linear attention",), causal=False),
    "nn.MultiheadAttention averaged weights": Case(
        "longtail/leftovers.py:AveragedWeights", True),
    "unused torch.arange(T)": Case("longtail/leftovers.py:UnusedPositions", True),
    "Gemma 2, --expect rotary softcap": Case(
        "longtail/hf_installed.py:Gemma2SelfAttention", True, ("soft-capping", "cap 0.5"),
        ("rotary", "softcap"), expect={**ROTARY, "mechanisms": ("softcap",)}),
    "gpt-oss, --expect rotary sinks": Case(
        "longtail/hf_installed.py:GptOssSelfAttention", True, ("attention sinks",),
        ("rotary", "sinks"), expect={**rotary(150000.0), "mechanisms": ("sinks",)}),
    "Qwen3, --expect rotary qk_norm": Case(
        "longtail/hf_installed.py:Qwen3SelfAttention", True, ("RMSNorm on q and k", "per head"),
        ("norm", "rotary"), expect={**rotary(1000000.0), "mechanisms": ("qk_norm",)}),
    "OLMo2, --expect rotary qk_norm": Case(
        "longtail/hf_installed.py:Olmo2SelfAttention", True, ("RMSNorm on q and k", "whole"),
        ("norm", "rotary"), expect={**rotary(500000.0), "mechanisms": ("qk_norm",)}),
    "open_clip cosine attention, --expect cosine": Case(
        "longtail/open_clip_attn.py:Attention", True, ("cosine attention", "learned scale"),
        ("cosine",), causal=False, expect={"mechanisms": ("cosine",)}),
    "T5 buckets, --expect pos_bias": Case(
        "longtail/hf_installed.py:T5SelfAttention", True, ("relative position bias", "T5"),
        ("pos_bias",), causal=False, expect={"mechanisms": ("pos_bias",)}),
    "SAM, --expect pos_bias": Case(
        "longtail/sam_attn.py:SamAttention", True, ("relative position terms",), ("pos_bias",),
        causal=False, expect={"mechanisms": ("pos_bias",)}),
    "differential attention (unilm), --expect differential": Case(
        "longtail/diff_attn.py:MultiheadDiffAttn", True, ("differential attention", "λ"),
        ("differential",), expect={"mechanisms": ("differential",)}),
    "DiffLlama, --expect rotary differential": Case(
        "longtail/hf_installed.py:DiffLlamaSelfAttention", True, ("differential attention",),
        ("differential",), expect={**ROTARY, "mechanisms": ("differential",)}),
    "post-norm residual": Case("mechanisms/post_norm.py:BertAttention", False,
                               ("residual",), ("residual",), causal=False),
}


@dataclass(frozen=True)
class Measured:
    name: str
    explained: bool
    kinds: tuple[str, ...]
    ops: tuple[str, ...]  # the titles of the anonymous `op` stages
    equivalent: bool | None  # None: could not judge
    reason: str  # the verdict's reference, else its diagnosis

    @property
    def staged(self) -> bool:
        return self.explained and not self.ops and all(k in self.kinds for k in CASES[self.name].kinds)

    @property
    def good(self) -> bool:
        case = CASES[self.name]
        said = self.reason.lower()
        return (self.staged and self.equivalent is case.equivalent
                and all(word.lower() in said for word in case.says))


def measure(name: str) -> Measured:
    from mha_tui.config import Config, Source
    from mha_tui.judge.outcome import outcome
    from mha_tui.pipeline import checked
    from mha_tui.records.request import Expect, Request

    case = CASES[name]
    config = Config("I love AI !", embed_dim=case.embed_dim, num_heads=case.heads,
                    causal=case.causal)
    source = Source(module=str(FIXTURES / case.ref), init=case.init)
    run, judge = checked(Request(config, source, Expect(**case.expect)))
    trace = run(config)
    kinds = tuple(stage.kind for stage in trace.stages)
    ops = tuple(stage.title for stage in trace.stages if stage.kind == "op")
    verdict = judge(trace)
    equivalent = {"equivalent": True, "NOT equivalent": False}.get(outcome(verdict))
    reason = verdict.reference if verdict.equivalent else (
        verdict.diagnosis.message if verdict.diagnosis else "")
    return Measured(name, not trace.failed, kinds, ops, equivalent, reason)


def main() -> None:
    import sys

    names = [n for n in CASES if not sys.argv[1:] or any(a in n for a in sys.argv[1:])]
    staged = good = 0
    for name in names:
        try:
            m = measure(name)
        except Exception as error:  # a measurement goes on past one module
            print(f"{name}: RAISED {type(error).__name__}: {error}")
            continue
        staged += m.staged
        good += m.good
        verdict = {True: "equivalent", False: "NOT equivalent", None: "could not judge"}[m.equivalent]
        print(f"{'S' if m.staged else '-'}{'G' if m.good else '-'} {name}: {len(m.kinds)} stages, "
              f"{len(m.ops)} op {list(m.ops)[:4]}; {verdict}: {m.reason[:160]}")
    print(f"{len(names)} configurations: {staged} fully staged, {good} fully good")


if __name__ == "__main__":
    main()

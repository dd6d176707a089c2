"""How a forward is called, read from its signature: which input each parameter gets.

One sequence (self-attention): x once, or x three times to `forward(query, key, value)`.
Two sequences (cross-attention, `--context`): the queries from x, the keys and values from
the context, given as public code names them: `forward(query, key, value)` (the Annotated
Transformer, `nn.MultiheadAttention`), `forward(x, context)` (Stable Diffusion),
`forward(x, xa)` (Whisper), `forward(hidden_states, key_value_states)` (T5, BART),
`forward(x, encoder_hidden_states)`, `forward(tgt, memory)` (`nn.Transformer`). A forward
with no such parameter cannot take a second sequence: `Refused` says why, in one line.

Reads signatures only: never import torch, rich, textual or typer here (the Python API and
the NumPy path call it too).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from .learner import MASK_NAMES, LoadError, safe

# The positional names of a forward that takes queries, keys and values separately.
QUERY_KEY_VALUE = (("query", "key", "value"), ("q", "k", "v"))
# The names public code gives the second sequence (the one keys and values come from).
CONTEXT_NAMES = ("context", "encoder_hidden_states", "key_value_states", "xa", "memory",
                 "encoder_output", "encoder_out", "enc_output", "cross_states", "kv_input")

# The names public code gives a padding mask: Hugging Face's (1 = a token, 0 = padding) and
# torch's (True = padding).
PAD_KEEP_NAMES = ("attention_mask",)
PAD_NAMES = ("key_padding_mask", "padding_mask", "src_key_padding_mask", "pad_mask")

# The caches of public code, found from the forward's signature (`--decode`): a cache passed
# in and returned (GPT-2's layer_past, Hugging Face's past_key_value(s), nanoGPT forks'
# past_kv / kv_cache), a position into a cache the module keeps (Meta Llama's start_pos,
# gpt-fast's input_pos), or a use_cache switch on a cache the module keeps (Raschka's, with
# reset_cache()).
PASSED_CACHE_NAMES = ("layer_past", "past_key_value", "past_key_values", "past_kv", "kv_cache",
                      "past", "layer_cache")
START_NAMES = ("start_pos",)
POSITIONS_NAMES = ("input_pos",)
RESET_NAMES = ("reset_cache", "reset_kv_cache", "clear_cache", "reset_caches")

# "x", "context", "mask" (the causal mask, or None), "mask+pad" (the causal mask and the
# padded keys, True where blocked, (B, 1, T, T)), "keep" ((B, T), 1 = a token, 0 = padding),
# "pad" ((B, T), True = padding)
Role = str


class Refused(LoadError):
    """The forward cannot be called with these inputs; the message is one line."""


@dataclass(frozen=True)
class Call:
    """Which input each parameter of a forward gets: positional arguments in order, and
    keywords by name. roles: "x" (the queries' sequence), "context" (the keys' and values'),
    "mask" (the causal mask, or None without one)."""

    args: tuple[Role, ...]
    kwargs: tuple[tuple[str, Role], ...] = ()
    # The parameter the context goes to ("" in self-attention): named in the words.
    context_parameter: str = ""
    # The parameter the padding mask goes to ("" without --batch).
    padding_parameter: str = ""
    # A required start_pos / input_pos (a cache the module keeps): given 0 / arange(T), the
    # whole sentence from position 0, as Meta's and gpt-fast's Transformer call it on a prompt.

    def build(self, inputs: dict[Role, object]) -> tuple[tuple[object, ...], dict[str, object]]:
        """The arguments themselves, from the tensor (or None) each role stands for."""
        return (tuple(inputs[role] for role in self.args),
                {name: inputs[role] for name, role in self.kwargs})


def _parameters(forward: Callable[..., object]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None


def _spelled(name: str, params: list[inspect.Parameter]) -> str:
    shown = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return f"{name}({', '.join(shown)})"


def plan(forward: Callable[..., object], name: str, *, causal: bool, context: bool = False,
         padding: bool = False) -> Call:
    """How mha-tui calls `forward` (`name`: `Class.forward`, for the refusals): with x alone,
    or with the context too; with padding (a padded batch, `--batch`) the padding mask goes
    to its parameter: `attention_mask` (1 = a token), `key_padding_mask` or `padding_mask`
    (True = padding), or else a `mask` / `attn_mask` that then blocks the padded keys and,
    when causal, the later tokens. Raises Refused (one line) when it cannot be called so."""
    params = _parameters(forward)
    if params is None:
        if context:
            raise Refused(f"{safe(name)} has no signature mha-tui can read, so it cannot tell "
                          "which parameter takes the context")
        return Call(args=("x",))
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.name not in MASK_NAMES]
    required = [p for p in positional if p.default is p.empty]
    three = tuple(p.name for p in positional[:3]) in QUERY_KEY_VALUE
    kwargs: list[tuple[str, Role]] = []
    context_parameter = ""
    if context:
        if three:  # forward(query, key, value): keys and values from the context
            args: tuple[Role, ...] = ("x", "context", "context")
            context_parameter = f"{positional[1].name} and {positional[2].name}"
        else:
            named = next((p for p in params if p.name in CONTEXT_NAMES), None)
            if named is None or not positional or named is positional[0]:
                raise Refused(
                    f"{safe(_spelled(name, params))} takes one sequence: --context needs a "
                    f"parameter for the second one ({', '.join(CONTEXT_NAMES[:5])}, ...) or "
                    "forward(query, key, value)")
            context_parameter = named.name
            # Second in the signature itself, not only among the non-mask parameters: T5's
            # forward(hidden_states, mask=None, key_value_states=None) takes it by name.
            ordered = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if named.kind is named.KEYWORD_ONLY or named is not ordered[1]:
                args = ("x",)
                kwargs.append((named.name, "context"))
            else:
                args = ("x", "context")
    elif three:
        args = ("x", "x", "x")
    elif positional or any(p.kind is p.VAR_POSITIONAL for p in params):
        args = ("x",)
    else:
        raise Refused(f"{safe(name)}() takes no input; mha-tui gives it x, shape (B, T, C)")
    for p in params:
        if p.default is p.empty and p.name in START_NAMES + POSITIONS_NAMES and \
                p not in positional[:len(args)]:
            kwargs.append((p.name, "start" if p.name in START_NAMES else "positions"))
    given = {n for n, _ in kwargs}
    if len([p for p in required if p.name not in given]) > len(args):
        listed = ", ".join(p.name for p in required)
        raise Refused(f"{safe(name)}({listed}) needs {len(required)} inputs; mha-tui gives x, or "
                      "x three times to forward(query, key, value)"
                      + ("" if context else ", or x and --context"))
    for p in params:
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in MASK_NAMES \
                and p.name not in given:
            raise Refused(f"{safe(name)} needs {p.name!r}, which mha-tui cannot give; give it a "
                          "default")
    pad = next((p for p in params if p.name in PAD_KEEP_NAMES + PAD_NAMES), None)
    if padding and pad is not None:
        kwargs.append((pad.name, "keep" if pad.name in PAD_KEEP_NAMES else "pad"))
    combined = padding and pad is None
    if combined and not any(p.name in MASK_NAMES for p in params):
        raise Refused(f"{safe(_spelled(name, params))} has no parameter for a padding mask "
                      "(attention_mask, key_padding_mask, padding_mask or mask): --batch pads "
                      "the shorter rows, and their padded keys must be blocked")
    for p in params:
        # A causal mask is for one sequence attending to itself: none across two sequences
        # (the module may still apply its own, and the words then say so).
        if p.name in MASK_NAMES and combined:
            kwargs.append((p.name, "mask+pad"))
        elif p.name in MASK_NAMES and ((causal and not context) or p.default is p.empty):
            kwargs.append((p.name, "mask"))
    return Call(args=args, kwargs=tuple(kwargs), context_parameter=context_parameter,
                padding_parameter=pad.name if padding and pad is not None else
                next((n for n, r in kwargs if r == "mask+pad"), ""))


@dataclass(frozen=True)
class CacheStyle:
    """How a forward keeps its KV cache (`--decode`), read from its signature.

    kind: "passed" (the cache goes in by `parameter` and comes back in the result, GPT-2 /
    Hugging Face tuples), "start_pos" (Meta Llama: the module writes its cache_k / cache_v
    at start_pos), "input_pos" (gpt-fast: a KVCache module written at the positions given),
    "kept" (Raschka: `use_cache=True` appends to a cache the module keeps; `reset` empties
    it). use_cache: the forward has a `use_cache` switch (given True on cached calls)."""

    kind: str
    parameter: str
    use_cache: bool = False
    reset: str = ""

    @property
    def words(self) -> str:
        """The style in a few words, for the screen and the verdict."""
        if self.kind == "passed":
            return (f"a cache passed in as {self.parameter} and returned"
                    + (", use_cache=True" if self.use_cache else ""))
        if self.kind == "start_pos":
            return "a cache kept in the module, written at start_pos (Meta Llama's)"
        if self.kind == "input_pos":
            return "a cache kept in the module, written at input_pos (gpt-fast's KVCache)"
        return ("a cache kept in the module, use_cache=True" +
                (f", emptied by {self.reset}()" if self.reset else ", no reset method"))


def cache_style(forward: Callable[..., object], name: str, methods: frozenset[str] = frozenset()
                ) -> CacheStyle:
    """The KV cache `forward` keeps (`methods`: the module's method names, for its reset).
    Raises Refused (one line) when the signature shows none."""
    params = _parameters(forward)
    names = [p.name for p in params or ()]
    use_cache = "use_cache" in names
    reset = next((m for m in RESET_NAMES if m in methods), "")
    passed = next((n for n in names if n in PASSED_CACHE_NAMES), None)
    if passed is not None:
        return CacheStyle("passed", passed, use_cache=use_cache)
    for kind, spelled in (("start_pos", START_NAMES), ("input_pos", POSITIONS_NAMES)):
        found = next((n for n in names if n in spelled), None)
        if found is not None:
            return CacheStyle(kind, found, use_cache=use_cache, reset=reset)
    if use_cache:
        return CacheStyle("kept", "use_cache", use_cache=True, reset=reset)
    shown = _spelled(name, params) if params is not None else safe(name)
    raise Refused(f"{safe(shown)} keeps no KV cache: --decode needs a cache passed in and returned "
                  "(layer_past, past_key_value, past_kv), a position into the module's own cache "
                  "(start_pos, input_pos), or use_cache=True with reset_cache()")

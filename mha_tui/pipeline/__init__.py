"""One pipeline for every caller: load -> trace -> recognise -> judge.

Every caller enters through one door: it builds a `Request` (records/request.py: which
module, the sentence and sizes, the options) and hands it to `traced` (a Trace), `verdict`
(a Verdict) or `comparison` (a Comparison); `load` builds a request's module alone (so that
bad input is refused before the app opens), `checked` its trace-and-judge pair for the app.
A request's module is built here from its `source` (`--model`, `--module`), or given as an
object (`Given`: the notebook), or is a whole model (its `checkpoint`: `--hf`, `--model
induction`), loaded and traced by `pipeline.whole`, the one submodule that reaches
transformers, imported by the CLI alone.

The CLI (`explain`, `check`), the app's loading worker, `--hf`, the NumPy path and the Python
API (`mha_tui.trace`) all run through here, so each step happens in one place: the loader
builds the module and its input (`load/`), the tracer records one forward
(`tracing`), the recogniser turns the recording into stages (`recognise`), the check judges
them (`check`). Each step is imported when it runs: importing this module costs nothing
(the app paints its first frame before torch or NumPy is imported).
Never import rich, textual or typer here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..records import Recorded, Recording, Trace
from ..records.request import Expect, Given, Request
from .recognition import recognised

if TYPE_CHECKING:
    from ..config import Source
    from ..judge import Verdict
    from ..judge.compare import Comparison
    from ..load.modules import LoadedTorch
    from ..load.numpy_modules import LoadedNumpy




# ---------------------------------------------------------------- trace a module

def trace(module: Any, x: Any, tokens: Sequence[str] | None = None, *, context: Any = None,
          context_tokens: Sequence[str] | None = None, decode: int = 0, **options: Any) -> Trace:
    """The Python API (`mha_tui.trace`): trace one forward of a torch or a NumPy module.

    context: cross-attention's second sequence (B, T_k, C'), given to the forward's
    parameter for it (`load.signature`: `forward(query, key, value)`, `forward(x, context)`,
    `(x, xa)`, `(hidden_states, key_value_states)`, ...); context_tokens label its T_k axis
    (default c0, c1, ...).

    decode: generate the last `decode` tokens of x one at a time against the module's KV
    cache, after a prefill of the others (`pipeline.decode`): the Trace is the first step's,
    its `steps` every step's."""
    if decode:
        if context is not None:
            from ..config import ConfigError
            from ..tracing.decode import decode_refusal

            raise ConfigError(decode_refusal(module, cross=True, batch=False).replace(
                "--decode with --context", "decode= with context=").replace(
                "--context alone", "context= alone"))
        from .decode import trace_decode

        return trace_decode(module, x, tokens, decode, config=options.get("config"),
                            embedding=options.get("embedding"), ids=options.get("ids"))
    if context is not None:
        traced = recognised(_record_cross(module, x, tokens, context, context_tokens, **options))
        refuse_stacked_cross(traced)
        return traced
    if type(x).__module__ == "numpy" and not _is_torch_module(module):
        return trace_numpy(module, x, tokens, **options)  # NumPy code: torch never loads
    from ..tracing import record_forward  # torch is imported only now

    return recognised(record_forward(module, x, tokens, **options))


def refuse_stacked_cross(trace: Trace) -> None:
    """Cross-attention (--context) explains one attention: a forward that runs two, one after
    the other (nn.TransformerDecoderLayer's self_attn, then multihead_attn), would have its
    first shown under the second's name. Refused in one line (LoadError) that names both."""
    if not trace.config.cross or trace.recording is None:
        return
    from ..recognise.cross import stacked_attentions

    found = stacked_attentions(trace.recording)
    if found is None:
        return
    from ..load.learner import LoadError

    first, second = found
    name = trace.module.class_name if trace.module is not None else "the module"
    raise LoadError(
        f"{name}.forward runs two attentions, one after the other: {first}, then {second} on "
        f"its output; --context explains one cross-attention, so give mha-tui the one that "
        f"reads the context ({second}: an nn.MultiheadAttention is --module "
        f"torch.nn:MultiheadAttention), or a module of yours that runs only it")


def _record_cross(module: Any, x: Any, tokens: Sequence[str] | None, context: Any,
                  context_tokens: Sequence[str] | None, *, call: Any = None,
                  config: Config | None = None, causal: bool = False, **options: Any) -> Recorded:
    """One forward of a torch module on x and a context, called by its signature."""
    from ..config import config_for
    from ..load.signature import plan
    from ..tracing import record_forward

    T_k = int(context.shape[-2])
    labels = tuple(context_tokens) if context_tokens is not None else tuple(f"c{i}" for i in range(T_k))
    if len(labels) != T_k:
        from ..config import ConfigError

        raise ConfigError(f"{len(labels)} context tokens for the {T_k} positions of the context, "
                          f"shape {tuple(context.shape)}: give one token per position")
    if call is None:
        how = plan(module.forward, f"{type(module).__name__}.forward", causal=causal, context=True)
        if causal:
            from ..load.modules import causal_mask

            mask: Any = causal_mask(int(x.shape[-2]))
        else:
            mask = None

        def call(m: Any, inp: Any) -> object:
            args, kwargs = how.build({"x": inp, "context": context, "mask": mask})
            return m(*args, **kwargs)

    config = config or config_for(module, tuple(x.shape), tokens)
    config = replace(config, context_labels=labels, causal=causal,
                     max_seq_len=max(config.max_seq_len, T_k))
    return record_forward(module, x, tokens, call=call, config=config, **options)


def trace_numpy(module: object, x: Any, tokens: Sequence[str] | None = None, *,
                args: tuple[object, ...] | None = None, kwargs: Mapping[str, object] | None = None,
                table: Any = None, ids: Any = None, config: Config | None = None,
                lookup: tuple[str, int] | None = None) -> Trace:
    """A NumPy module's forward on x (T, C), traced without torch. lookup: where x was
    looked up in table (file, line); by default the NumPy loader's own lookup line."""
    from ..tracing.numpy_ops import record_forward
    from ..tracing.source import source_at

    line = None
    if table is not None and ids is not None:
        if lookup is None:
            from ..load.numpy_modules import look_up

            lookup = look_up(table, ids)[1]
        line = source_at(*lookup)
    return recognised(record_forward(module, x, tokens, args=args, kwargs=kwargs, table=table,
                                     ids=ids, config=config, lookup=line))


def _is_torch_module(module: Any) -> bool:
    torch = sys.modules.get("torch")  # not imported: the module cannot be a torch one
    return torch is not None and isinstance(module, torch.nn.Module)


# ---------------------------------------------------------------- a Request's runs

def _refuse_unwired(request: Request) -> None:
    """A decode run's number of steps must leave a prompt (with --context or --batch, the
    module is needed to say why not: `_refuse_decode_with`)."""
    from ..config import ConfigError

    config = request.config
    if request.steps and config.model is None and not 1 <= request.steps < config.seq_len:
        raise ConfigError(f"--decode {request.steps}: the sentence has {config.seq_len} tokens; "
                          f"decode between 1 and {config.seq_len - 1} of them (at least one token "
                          "is the prompt)")


def _refuse_decode_with(request: Request, module: Any) -> None:
    """`--decode` with `--context` or `--batch`: refused in one line that says why for this
    module (`tracing.decode.decode_refusal`: no cache to decode against, one position for
    every row, no padding mask beside the cache, or not built yet)."""
    config = request.config
    if not request.steps or not (config.cross or config.batch):
        return
    from ..load.learner import LoadError
    from ..tracing.decode import decode_refusal

    raise LoadError(decode_refusal(module, cross=config.cross, batch=bool(config.batch)))


def load(request: Request) -> LoadedTorch | LoadedNumpy:
    """The request's module and its input; NumPy code (the blueprint, a NumPy --module
    class) never imports torch. Raises LoadError (one line) for bad --module, --init,
    --weights or --context."""
    from ..load.numpy_modules import load as load_numpy

    _refuse_unwired(request)
    loaded = load_numpy(request.config, request.source)
    if loaded is not None and request.steps:
        from ..load.learner import LoadError

        raise LoadError("--decode needs a torch module that keeps a KV cache; this one is NumPy code")
    if loaded is None:
        from ..load.modules import load as load_torch

        loaded = load_torch(request.config, request.source)
        _refuse_decode_with(request, loaded.module)
        if request.steps:  # a forward that keeps no cache is refused now, in one line
            from ..tracing.decode import style_of

            style_of(loaded.module)
    return loaded


def traced(request: Request, *, loaded: LoadedTorch | LoadedNumpy | None = None) -> Trace:
    """load -> trace -> recognise: the Trace of the request's module on its sentence (a
    `Given` module object: on its own x). loaded: the request's module, already built by
    `load`."""
    if isinstance(request.source, Given):
        return _given_trace(request)
    if request.checkpoint is not None:
        # A whole model has its own door, pipeline.whole: importing it from here would let
        # the app and the notebook reach transformers (an import-linter contract forbids it).
        raise ValueError("a request for a whole model (its checkpoint) is traced by "
                         "pipeline.whole.trace, not pipeline.traced")
    _refuse_unwired(request)
    if request.steps:
        return decoded(request, loaded=loaded)
    return run_trace(request.config, request.source, loaded=loaded)


def decoded(request: Request, *, loaded: LoadedTorch | LoadedNumpy | None = None) -> Trace:
    """`--decode N`: the module's full forward, a prefill, then each of the last N tokens
    traced against its KV cache (`pipeline.decode`); the first step's Trace holds them all.
    Raises LoadError (one line) for a NumPy module or a forward that keeps no cache."""
    from ..load.learner import LoadError

    if getattr(loaded, "library", "torch") == "numpy" or (
            loaded is None and load_numpy_source(request)):
        raise LoadError("--decode needs a torch module that keeps a KV cache; this one is NumPy code")
    from ..load.modules import load as load_torch
    from .decode import trace_decode

    loaded = loaded or load_torch(request.config, request.source)
    _refuse_decode_with(request, loaded.module)  # type: ignore[union-attr]
    trace = trace_decode(loaded.module, loaded.x, request.config.tokens, request.steps,  # type: ignore[union-attr]
                         config=request.config, embedding=loaded.embedding,  # type: ignore[union-attr]
                         ids=loaded.ids)  # type: ignore[union-attr]
    if loaded.weights and trace.module is not None:  # type: ignore[union-attr]
        module = replace(trace.module, weights=loaded.weights)  # type: ignore[union-attr]
        steps = tuple(replace(t, module=module) for t in trace.steps)
        trace = replace(steps[0], steps=steps)
    return trace


def load_numpy_source(request: Request) -> bool:
    """Whether the request names NumPy code (the blueprint, a NumPy --module class)."""
    from ..config import NUMPY_MODEL_NAMES

    source = request.source
    return (source.module is None and source.model in NUMPY_MODEL_NAMES) or (
        source.module is not None and _is_numpy(source.module))


def verdict(request: Request) -> Verdict:
    """load -> trace -> judge: `mha-tui check`'s verdict on the request's module, judged
    against `request.expect`."""
    # A module object given in Python, or --decode (the steps traced, then judged with the
    # full forward, judge.decode): checked's pair (which refuses what is not wired).
    if isinstance(request.source, Given) or request.steps:
        run, checker = checked(request)
        return checker(run(request.config))
    _refuse_unwired(request)
    return check_source(request.config, request.source, request.expect)


def comparison(request: Request, *, loaded: LoadedTorch | LoadedNumpy | None = None) -> Comparison:
    """`explain --against`: the request's module and `request.against` on the same x."""
    _refuse_unwired(request)
    if request.against is None:
        raise ValueError("comparison() needs a request with `against`")
    return compared(request.config, request.source, request.against,
                    loaded=loaded)  # type: ignore[arg-type]


# ---------------------------------------------------------------- a module object given in Python

def given_config(module: Any, x: Any, tokens: Sequence[str] | None = None, *,
                 embedding: Any = None, ids: Any = None) -> Config:
    """The sizes of a run on a `Given` module the caller did not describe (`config.config_for`):
    T and C from x's shape (or from `embedding(ids)`'s, when x is made by that lookup), h
    from the module's own head-count attribute, tokens t0, t1, ..."""
    from ..config import config_for

    if x is None and embedding is not None and ids is not None:
        shape = (*tuple(ids.shape), int(embedding.weight.shape[-1]))  # embedding(ids): (B, T, C)
    elif x is None:
        raise ValueError("trace() needs x, or an embedding and ids to make it")
    else:
        shape = tuple(x.shape)
    return config_for(module, shape, tokens)


def _given_options(request: Request) -> dict[str, Any]:
    """What the tracer is handed for a `Given` module: the caller's options, and when it is
    called as the CLI calls a module (`Given.causal` a bool), its inputs by its signature."""
    given = request.source
    assert isinstance(given, Given)
    options = dict(given.options)
    if given.causal is None:
        return options
    if not _is_torch_module(given.module):  # NumPy code: x (or x three times) and the mask
        from ..load.numpy_modules import forward_inputs as numpy_inputs

        args, kwargs = numpy_inputs(given.module, given.x, causal=given.causal)
        return {**options, "args": args, "kwargs": kwargs}
    from ..load.modules import LoadedTorch, forward_inputs

    args, kwargs = forward_inputs(given.module, given.x, causal=given.causal,
                                  context=given.context)
    # Called as the CLI calls a module it built: x once, as query, key and value, or with
    # the context, and the mask by name (load.modules.LoadedTorch.call).
    call = LoadedTorch(module=given.module, embedding=options.get("embedding"),  # type: ignore[arg-type]
                       ids=options.get("ids"), x=given.x, args=args, kwargs=kwargs).call
    return {**options, "call": call}


def _given_trace(request: Request, options: Mapping[str, Any] | None = None) -> Trace:
    """trace -> recognise of a `Given` module on its own x (`trace`, with the request's config)."""
    given = request.source
    assert isinstance(given, Given)
    options = _given_options(request) if options is None else options
    cross = {} if given.context is None else {"context": given.context,
                                              "context_tokens": given.context_tokens}
    return trace(given.module, given.x, given.tokens, decode=request.steps,
                 config=request.config, **cross, **options)


def _given_checked(request: Request) -> tuple[Callable[[Config], Trace], Callable[[Trace], Verdict]]:
    """checked() for a `Given` module: traced on its own x, then judged as `check` judges a
    module it built (torch: `judge_torch`, `--decode`: `judge_decode`; NumPy: `judge_numpy`),
    with the mask it was called with (`Given.causal`, True when not said)."""
    given = request.source
    assert isinstance(given, Given)
    options = _given_options(request)
    causal = True if given.causal is None else given.causal

    def run(config: Config) -> Trace:
        return _given_trace(replace(request, config=config), options)

    if not _is_torch_module(given.module):
        def numpy_checker(traced: Trace) -> Verdict:
            return judge_numpy(traced, given.module, options.get("args") or (given.x,),
                               options.get("kwargs") or {}, causal=causal,
                               heads=traced.config.num_heads, label=given.name,
                               expect=request.expect)

        return run, numpy_checker
    call = options.get("call") or (lambda m, inp: m(inp))
    if request.steps:
        def decode_checker(traced: Trace) -> Verdict:
            return judge_decode(traced, given.module, given.x, call, steps=request.steps,
                                config=request.config, embedding=options.get("embedding"),
                                ids=options.get("ids"), label=given.name, expect=request.expect)

        return run, decode_checker

    def checker(traced: Trace) -> Verdict:
        return judge_torch(traced, given.module, given.x, call, causal=causal,
                           heads=traced.config.num_heads, label=given.name,
                           expect=request.expect, context=given.context)

    return run, checker


# ---------------------------------------------------------------- the CLI's and the app's runs

def run_trace(config: Config, source: Source | None = None, *,
              loaded: LoadedTorch | LoadedNumpy | None = None) -> Trace:
    """load -> trace -> recognise: the module (`--model`, default mygpt, or `--module`) on the
    sentence.

    loaded: a module the CLI has already built (so that bad input was refused before the
    app opened). Raises `mha_tui.load.learner.LoadError` (one line) when the module cannot be
    built. A NumPy module (`load.numpy_modules`) is traced by the NumPy adapter, without torch.
    """
    if getattr(loaded, "library", "torch") == "numpy":
        return numpy_runner(loaded)(config)  # type: ignore[arg-type]
    from ..load.modules import load

    loaded = loaded or load(config, source)
    from ..tracing import record_forward

    # The learner's prints go to stderr (tracing does it for every forward it runs).
    recorded = record_forward(loaded.module, loaded.x, config.tokens, call=loaded.call,
                              embedding=loaded.embedding, ids=loaded.ids, config=config)
    trace = recognised(recorded)
    refuse_stacked_cross(trace)
    if loaded.weights and trace.module is not None:  # the header says whose numbers these are
        trace = replace(trace, module=replace(trace.module, weights=loaded.weights))
    return trace


def numpy_runner(loaded: LoadedNumpy) -> Callable[[Config], Trace]:
    """How the CLI and the app trace a built NumPy module: trace -> recognise."""

    def run(config: Config) -> Trace:
        return trace_numpy(loaded.module, loaded.x, config.tokens, args=loaded.args,
                           kwargs=loaded.kwargs, table=loaded.table, ids=loaded.ids,
                           config=config, lookup=loaded.lookup)

    return run


# ---------------------------------------------------------------- the check

def checked(request: Request) -> tuple[Callable[[Config], Trace], Callable[[Trace], Verdict]]:
    """Build the request's module now (bad input fails here); return how to trace it and
    how to judge a trace of it: load -> trace -> what needs running again (torch) -> judge,
    against `request.expect` (--expect rotary, --window N)."""
    from ..load.numpy_modules import load as load_numpy

    if isinstance(request.source, Given):
        return _given_checked(request)
    _refuse_unwired(request)
    config, source, grown = request.config, request.source, request.expect
    numpy_loaded = load_numpy(config, source)
    if numpy_loaded is not None:  # NumPy code: judged the same way, without torch
        return _checked_numpy(config, numpy_loaded, grown)
    from ..load.modules import load

    loaded = load(config, source)
    _refuse_decode_with(request, loaded.module)

    def call(module: object, x: object) -> object:  # x once, as query, key and value, or with the context
        return loaded.call(module, x)  # type: ignore[arg-type]

    if request.steps:
        return _checked_decode(request, loaded, call)

    def run(config: Config) -> Trace:
        return run_trace(config, loaded=loaded)

    def checker(traced: Trace) -> Verdict:
        return judge_torch(traced, loaded.module, loaded.x, call, causal=config.causal,
                           heads=config.num_heads, label=loaded.label, expect=grown,
                           context=loaded.context,
                           padding=config.padding if config.batch else None)

    return run, checker


def _checked_decode(request: Request, loaded: LoadedTorch, call: Callable[[Any, Any], object]
                    ) -> tuple[Callable[[Config], Trace], Callable[[Trace], Verdict]]:
    """checked() for `--decode N`: the steps traced (run), then the full forward judged
    against the reference, each step against the full forward's row, and a second run
    after the module's own reset against the first (`judge.decode`)."""
    config = request.config

    def run(config: Config) -> Trace:
        return decoded(request, loaded=loaded)

    def checker(traced: Trace) -> Verdict:
        return judge_decode(traced, loaded.module, loaded.x, call, steps=request.steps,
                            config=config, embedding=loaded.embedding, ids=loaded.ids,
                            label=loaded.label, expect=request.expect)

    return run, checker


def judge_decode(traced: Trace, module: Any, x: Any, call: Callable[[Any, Any], object], *,
                 steps: int, config: Config, embedding: Any = None, ids: Any = None,
                 label: str = "", expect: Expect | None = None) -> Verdict:
    """judge a decode run (`traced`: the first step's Trace, holding every step's): the full
    forward traced again and judged against the reference, each step against its row, and
    a second run after the module's own reset against the first (`judge.decode`). `check
    --decode` and the notebook's `mha_tui.check(decode=N)` both come here."""
    from ..judge.decode import decode_verdict
    from ..tracing.decode import style_of
    from .decode import trace_decode

    full = recognised(_record_full(module, x, config, call, embedding, ids))
    base = judge_torch(full, module, x, call, causal=config.causal, heads=config.num_heads,
                       label=label, expect=expect)
    again = trace_decode(module, x, config.tokens, steps, config=config, embedding=embedding,
                         ids=ids)
    return decode_verdict(base, traced.steps or (traced,), again.steps,
                          reset=_reset_place(module, style_of(module).reset), asked=steps)


def _record_full(module: Any, x: Any, config: Config, call: Callable[[Any, Any], object],
                 embedding: Any, ids: Any) -> Recorded:
    from ..tracing import record_forward

    return record_forward(module, None if embedding is not None else x, config.tokens, call=call,
                          embedding=embedding, ids=ids, config=config)


def _reset_place(module: Any, name: str) -> tuple[str, int, str] | None:
    """Where the module's cache reset is written (file, line, name), None without one."""
    import inspect

    method = getattr(type(module), name, None) if name else None
    if method is None:
        return None
    try:
        return inspect.getsourcefile(method) or "", inspect.getsourcelines(method)[1], name
    except (OSError, TypeError):
        return None


def judge_torch(traced: Trace, module: Any, x: Any, call: Callable[[Any, Any], object], *,
                causal: bool, heads: int, label: str, expect: Expect | None = None,
                context: Any = None, padding: Any = None) -> Verdict:
    """judge a torch module's trace: what needs running again (a second forward, the
    reference with its weights copied in), then the verdict. `mha-tui check` and the
    notebook's `mha_tui.check` both come here. context: cross-attention's second sequence
    (the reference then takes its keys and values from it, with no causal mask). padding:
    (B, T) True where a padded batch's row is padding (the reference blocks those keys)."""
    from functools import partial

    from ..judge import Facts, judge
    from ..tracing.rerun import (
        cross_reference_output,
        parameter_shapes,
        reference_output,
        second_recording,
    )
    from .threads import one_blas_thread

    reference: Any = reference_output
    named: dict[str, Any] = {}
    if context is not None or padding is not None:
        reference = partial(cross_reference_output,
                            context=None if context is None else context.detach().numpy(),
                            padding=padding)
        named = {"reference_name": "the cross reference (queries from x, keys and values from "
                                   "the context)" if context is not None else
                                   "the reference with the padded keys blocked"}
        causal = causal and context is None
    facts = Facts(causal=causal, heads=heads, parameters=parameter_shapes(module),
                  second=partial(second_recording, module, x, call), reference=reference,
                  training=module.training, padding=padding, **named,
                  **(expect or Expect()).facts())
    with one_blas_thread():  # its float64 products beside torch's threads (threads.py)
        return judge(traced, facts, label)


def _checked_numpy(config: Config, loaded: LoadedNumpy, expect: Expect
                   ) -> tuple[Callable[[Config], Trace], Callable[[Trace], Verdict]]:
    """checked() for a NumPy module: a second NumPy recording, its arrays as parameters,
    and the blueprint's computation in NumPy as the end-to-end reference."""

    def checker(trace: Trace) -> Verdict:
        return judge_numpy(trace, loaded.module, loaded.args, loaded.kwargs,
                           causal=config.causal, heads=config.num_heads, label=loaded.label,
                           expect=expect)

    return numpy_runner(loaded), checker


def judge_numpy(trace: Trace, module: object, args: Sequence[object], kwargs: Mapping[str, object],
                *, causal: bool, heads: int, label: str, expect: Expect | None = None) -> Verdict:
    """judge a NumPy module's trace: a second NumPy recording, its arrays as parameters, and
    the blueprint's computation in NumPy as the end-to-end reference."""
    import numpy as np

    from ..judge import Facts, judge
    from ..judge.numpy_reference import reference_output
    from ..tracing.numpy_ops import module_arrays, record

    def second() -> Recording | None:
        with np.errstate(all="ignore"):
            again = record(module, tuple(args), dict(kwargs))
        return None if again.error else again.recordings[""]

    facts = Facts(causal=causal, heads=heads,
                  parameters=tuple((name, tuple(a.shape)) for name, a in module_arrays(module).items()),
                  second=second,
                  reference=reference_output, training=False,
                  reference_name="the NumPy blueprint's computation",
                  **(expect or Expect()).facts())
    return judge(trace, facts, label)


def check_source(config: Config, source: Source, expect: Expect | None = None) -> Verdict:
    """Judge one module: what `mha-tui check` does for each it is given."""
    run, checker = checked(Request(config, source, expect or Expect()))
    return checker(run(config))


# ---------------------------------------------------------------- explain --against

def compared(config: Config, source: Source, against: Source, *,
             loaded: LoadedTorch | None = None) -> Comparison:
    """`explain --against`: the learner's module and a reference on the same x, the
    learner's weights copied into the reference by role (as `check` finds them), their
    stages paired by kind (`judge.compare`).

    Raises LoadError when a module cannot be built, `judge.roles.RoleCopyError` when the
    weights cannot be copied by role (both one line). The learner's trace may have failed
    (its forward raised): the comparison then holds its stages up to the error.
    """
    from ..judge.compare import compare
    from ..judge.roles import RoleCopyError, copy_by_role, roles_of
    from ..load.learner import LoadError
    from ..load.modules import load, on_table
    from ..load.numpy_modules import load as load_numpy
    from ..tracing.rerun import parameter_values, set_parameters

    mine_loaded = loaded or load_numpy(config, source) or load(config, source)
    try:
        if against.module is not None and _is_numpy(against.module):
            raise LoadError(f"--module {against.module} is NumPy code: the reference must be "
                            "a torch module (your weights are copied into its parameters)")
        reference = load(config, against)
    except LoadError as error:  # the loader names --module; here it is the reference
        raise LoadError(f"--against: {str(error).removeprefix('--module ')}") from None
    if getattr(mine_loaded, "library", "torch") == "numpy":
        # NumPy code looks x up in its own table (load.numpy_modules): the reference, a
        # torch module, reads the same rows, so that both run on the same x.
        reference = on_table(reference, mine_loaded.table)  # type: ignore[union-attr]
    shown = f"--against {against.module or against.model}"
    if not _same_input(mine_loaded.x, reference.x):  # both built from --seed: never expected
        raise RoleCopyError(f"{shown} was given a different x than your module")
    mine = run_trace(config, loaded=mine_loaded)
    theirs = run_trace(config, loaded=reference)
    if theirs.failed:
        raise RoleCopyError(f"{shown}'s own forward raised {theirs.raised}")
    heads = config.num_heads
    their_roles = roles_of(theirs, heads)
    if their_roles is None:
        raise RoleCopyError(f"{shown}: its Q, K and V projections could not be found by role, "
                            "so your weights cannot be copied into it")
    how: tuple[str, ...] = ()
    if not mine.failed:
        my_roles = roles_of(mine, heads)
        if my_roles is None:
            raise RoleCopyError("your module's Q, K and V projections could not be found by "
                                "role (each must be a (C, C) linear map of x, or a slice of a "
                                "fused one), so they cannot be copied into the reference")
        values, how = copy_by_role(parameter_values(reference.module), theirs, their_roles,
                                   my_roles, shown=shown)
        set_parameters(reference.module, values)
        theirs = run_trace(config, loaded=reference)
    return compare(mine, theirs, mine_label=mine_loaded.label, theirs_label=reference.label,
                   weights=how)


def _is_numpy(module: str) -> bool:
    """Whether FILE.py:Class names NumPy code (a file that does not load: the torch loader
    says why, naming its nn.Module classes)."""
    from ..load.learner import LoadError
    from ..load.numpy_modules import numpy_class

    try:
        return numpy_class(module) is not None
    except LoadError:
        return False


def _same_input(a: Any, b: Any) -> bool:
    """The same numbers in the same order; a NumPy module's x (T, C) has no batch axis."""
    import numpy as np

    a, b = (np.asarray(t.detach() if hasattr(t, "detach") else t) for t in (a, b))
    return a.squeeze().shape == b.squeeze().shape and bool((a.squeeze() == b.squeeze()).all())

"""One Request for every entry point (records/request.py): the grader's worker gets the same
Request `check` builds, through JSON; the fields kept for batch rows and decode steps are
refused until they are wired, never ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui import pipeline
from mha_tui.config import Config, ConfigError, Source
from mha_tui.records.request import Expect, Request


@pytest.mark.parametrize("two", [{"context": "le chat"}, {"batch": ("a dog",)}])
def test_a_request_survives_the_trip_to_the_grader_worker(two: dict[str, object]) -> None:
    """as_json -> from_json gives an equal Request: every option reaches the worker (a
    context or a padded batch: the two together are refused)."""
    request = Request(Config("the cat sat", embed_dim=8, num_heads=4, seed=3, causal=False,
                             max_seq_len=16, **two),
                      Source(module="tests/fixtures/mechanisms/alibi.py:BloomAttention",
                             init=(("bias", True), ("dropout", 0.25), ("name", "x"))),
                      Expect(rotary=True, window=3, alibi=False, rotary_base=500.0))
    again = Request.from_json(request.as_json())
    assert vars(again.source) == vars(request.source)  # Source compares by identity
    assert (again.config, again.expect, again.against, again.rows, again.steps) == \
        (request.config, request.expect, request.against, request.rows, request.steps)
    if "context" in two:
        assert again.config.key_tokens == ("le", "chat")
    else:
        assert again.rows == ("a dog",) and again.config.rows[1] == ("a", "dog", "<pad>")


def test_the_worker_reads_the_graders_limits_beside_the_request() -> None:
    """Extra keys (memory, processes) are the pool's, not the Request's."""
    data = {**Request(Config("I love AI !")).as_json(), "memory": 1 << 20, "processes": 4}
    again = Request.from_json(data)
    assert again.config == Config("I love AI !") and again.source.is_default


def test_decode_steps_run_through_the_request() -> None:
    """`steps` (--decode N) reaches the pipeline: a trace per step; a module that keeps no
    cache is refused in one line when it is built, and steps travel to the grader's worker."""
    from mha_tui.load.learner import LoadError

    source = Source(module="tests/fixtures/kv_caches.py:GPT2Attention")
    request = Request(Config("I love AI !"), source, steps=2)
    assert Request.from_json(request.as_json()).steps == 2
    trace = pipeline.traced(request)
    assert [t.step.position for t in trace.steps] == [2, 3]
    with pytest.raises(LoadError, match="keeps no KV cache"):
        pipeline.load(Request(Config("I love AI !"), steps=2))
    with pytest.raises(ConfigError, match="decode between 1 and 3"):
        pipeline.traced(Request(Config("I love AI !"), source, steps=4))


def test_traced_is_run_trace_on_the_requests_module() -> None:
    """The Request door and the config-and-source one give the same stages."""
    config, source = Config("I love AI !", embed_dim=8, num_heads=2), Source(model="course")
    through_request = pipeline.traced(Request(config, source))
    direct = pipeline.run_trace(config, source)
    assert [s.id for s in through_request.stages] == [s.id for s in direct.stages]
    assert through_request.module == direct.module
    assert through_request.module is not None and "course" in through_request.module.file


def test_batch_rows_run_through_the_request() -> None:
    """A padded batch's rows travel in the Request's config (`rows` reads config.batch)."""
    request = Request(Config("I love AI !", batch=("the cat",)), Source(model="course"))
    assert request.rows == ("the cat",)
    trace = pipeline.traced(request)
    assert trace.stage("scores").tensors[-1].values.shape[0] == 2


def test_the_grader_sends_each_worker_checks_request_with_the_submissions_module() -> None:
    """grade/pool.py builds each worker's Request from the one `check` made: every option
    (sizes, --init, --weights, --expect) as given, the module the submission's, and the
    paths absolute (the worker runs in a folder of its own)."""
    from mha_tui.grade import Limits, Submission
    from mha_tui.grade.pool import worker_request

    check = Request(Config("the cat sat", embed_dim=8, num_heads=4, seed=3, causal=False),
                    Source(init=(("bias", True),), weights="w.pt"),
                    Expect(window=2, rotary_base=500.0))
    sub = Submission(shown="ada", module="ada/attn.py:MultiHeadAttention")
    data = worker_request(sub, Limits(check, timeout=5, memory=1 << 20))
    sent = Request.from_json(data)
    assert (sent.config, sent.expect) == (check.config, check.expect)
    assert sent.source.init == (("bias", True),)
    assert sent.source.module == f"{Path('ada/attn.py').resolve()}:MultiHeadAttention"
    assert sent.source.weights == str(Path("w.pt").resolve())
    assert data["memory"] == 1 << 20
    model = Request.from_json(worker_request(Submission(shown="course", model="course"),
                                             Limits(check)))
    assert (model.source.model, model.source.module) == ("course", None)


def test_a_results_files_fingerprint_holds_what_it_held_before_the_request() -> None:
    """--resume matches a results file's lines by the grading's settings: the Request's
    fields that were fingerprinted before it carried them all, and a field added since only
    when it is set, so that a file written before still resumes."""
    from mha_tui.grade.journal import settings

    check = Request(Config("I love AI !"), Source(init=(("bias", False),)), Expect(window=3))
    assert settings(check) == {
        "sentence": "I love AI !", "embed_dim": 4, "heads": 2, "seed": 0, "causal": True,
        "max_seq_len": 64, "init": ["bias=False"], "weights": None, "rotary": False,
        "window": 3, "alibi": False, "rotary_base": 10000.0}
    crossed = Request(Config("I love AI !", context="le chat"))
    assert settings(crossed)["context"] == "le chat"
    assert settings(check.of_module("course")) == settings(check)


@pytest.mark.parametrize(("config", "T_q", "T_k"), [
    (Config("the cat sat"), 3, 3),  # self-attention: the keys are the queries' own tokens
    (Config("the cat sat", context="le chat noir est là"), 3, 5),  # cross-attention: the context's
    (Config("a dog", batch=("the cat sat on",)), 4, 4),  # a padded batch: the longest row
    (Config("sat", cached=("the", "cat")), 1, 3),  # a decode step: the cache's and the new token
])
def test_the_config_knows_the_queries_and_the_keys_lengths(config: Config, T_q: int, T_k: int) -> None:
    """T_q (seq_len, as --max-seq-len speaks) counts the queries, T_k the keys they look at:
    the numbers the header shows and the recogniser's Sizes hold."""
    assert (config.T_q, config.T_k, config.seq_len) == (T_q, T_k, T_q)
    assert len(config.key_tokens) == T_k and len(config.tokens) == T_q


def test_the_recognisers_sizes_hold_both_lengths() -> None:
    """A traced cross-attention: Sizes.T_q is x's tokens, Sizes.T_k the context's, as the
    config that made the run says."""
    from mha_tui.ops.sizes import Sizes

    sizes = Sizes(1, 3, 4, 2, 2, T_k=5)
    assert (sizes.T_q, sizes.T_k, sizes.keys) == (3, 5, 5)
    assert (Sizes(1, 3, 4, 2, 2).T_q, Sizes(1, 3, 4, 2, 2).keys) == (3, 3)
    trace = pipeline.traced(Request(Config("the cat sat", context="le chat noir est là"),
                                    Source(model="cross")))
    assert (trace.config.T_q, trace.config.T_k) == (3, 5)

"""The garbage collector held back while the app starts (collector.py): paused by the
`mha-tui` command before the app is imported, started again (with the start-up's objects
frozen) before a module's own code runs, and at the latest when the first forward is done.
Only the command's own process pauses it; a caller's collector (tests, a notebook) is
left as it is."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from mha_tui import collector
from mha_tui.app.explain import ExplainApp
from mha_tui.cli import process
from mha_tui.config import Config
from mha_tui.load.learner import learner_code
from mha_tui.records import Trace
from mha_tui.serve import SERVE_ENV

from .conftest import default_trace, settle


@pytest.fixture(autouse=True)
def collector_as_found() -> Iterator[None]:
    """Each test leaves the process's collector on, and nothing frozen."""
    assert gc.isenabled() and not collector.paused()
    frozen = gc.get_freeze_count()
    try:
        yield
    finally:
        collector.resume()
        gc.enable()
        if gc.get_freeze_count() != frozen:
            gc.unfreeze()


def test_pause_then_resume_freezes_what_the_start_made() -> None:
    collector.pause()
    assert not gc.isenabled() and collector.paused()
    collector.resume(freeze=True)
    assert gc.isenabled() and not collector.paused()
    assert gc.get_freeze_count() > 0


def test_resume_without_freeze_only_starts_the_collector() -> None:
    frozen = gc.get_freeze_count()
    collector.pause()
    collector.resume()
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    """Not paused by mha-tui: resume neither starts it nor freezes anything."""
    frozen = gc.get_freeze_count()
    gc.disable()
    collector.pause()
    assert not collector.paused()
    collector.resume(freeze=True)
    assert not gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_modules_own_code_runs_with_the_collector_on() -> None:
    """A learner's forward may make cyclic garbage (without end, if it never returns): it
    never runs with the collector paused, and only what was alive before it is frozen."""
    collector.pause()
    with learner_code("building M(4, 2)", "m.py"):
        assert gc.isenabled() and not collector.paused()
        assert gc.get_freeze_count() > 0


def test_the_command_opens_the_app_with_the_collector_paused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The `mha-tui` process: paused while the app runs (it imports the app then), started
    again when the app returns, also through an exit."""
    monkeypatch.setattr(process, "STANDALONE", True)
    monkeypatch.setenv(SERVE_ENV, "1")  # no terminal to prepare here
    seen: list[tuple[bool, bool]] = []

    def app() -> None:
        seen.append((gc.isenabled(), collector.paused()))

    process.open_app(app)
    assert seen == [(False, True)]
    assert gc.isenabled() and not collector.paused()

    def refused() -> None:
        raise SystemExit(2)

    with pytest.raises(SystemExit):
        process.open_app(refused)
    assert gc.isenabled() and not collector.paused()


def test_a_caller_of_the_cli_keeps_its_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (CliRunner, a notebook): never paused."""
    monkeypatch.setenv(SERVE_ENV, "1")
    seen: list[bool] = []
    process.open_app(lambda: seen.append(gc.isenabled()))
    assert seen == [True]


async def test_the_first_forward_done_starts_the_collector_again() -> None:
    """A loader that runs no learner's code (a --hf model is built before the app): the
    collector is on once it returns, and nothing of the forward's was frozen."""
    trace = default_trace()
    frozen = gc.get_freeze_count()
    during: list[bool] = []

    def loader(config: Config) -> Trace:
        during.append(gc.isenabled())
        return trace

    collector.pause()
    app = ExplainApp(trace.config, loader=loader)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await settle(app, pilot, until=lambda: app.trace is not None)
        assert app.trace is trace
    assert during == [False]
    assert gc.isenabled() and not collector.paused() and gc.get_freeze_count() == frozen

"""`s` in the app: the sentence line is there at the key (issue 27, section 6). It is built
with the app and only shown, so the key typed right after `s` lands in it, never in the stage
view; esc hides it and the app's keys work again."""

from __future__ import annotations

from textual.widgets import Input

from .test_app import make_app, stage_id


async def test_the_key_after_s_lands_in_the_sentence_line() -> None:
    app = make_app(start="softmax")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await pilot.press("s", "end", "space", "l", "n")  # no pause: typed as fast as it comes
        await pilot.pause()
        field = app.query_one("#sentence-input", Input)
        assert app.focused is field and field.value == "I love AI ! ln", field.value
        assert stage_id(app) == "softmax"  # `l` and `n` did not move to the next stage


async def test_esc_keeps_the_sentence_and_gives_the_keys_back() -> None:
    app = make_app(start="softmax")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("s", "x", "escape")
        await pilot.pause()
        assert not app.query_one("#sentence-body").display
        assert app.config.sentence == "I love AI !"
        await pilot.press("l")
        assert stage_id(app) == "attend"

"""The Textual step-through app: which stage is shown, keys, layout, screens. Drawing is
`render`'s job; the app only chooses what to show and how wide.

- `explain.py`: `ExplainApp`, its layout (compose), its reactives and how a stage is shown;
- `keys.py`: the bindings, the help's rows, which keys act now, the view-changing actions;
- `loading.py`: the trace-loading worker (a daemon thread) and running again on new input;
- `drill.py`: the cell cursor and the why panel; `layers.py`: `--hf`'s layers;
- `quiz.py`: quiz mode (`--quiz`): the question bar and the stages hidden until answered;
- `widgets.py`: the stage rail, footer, help and sentence dialogs, too-small notice, ASCII;
- `stage_view.py`: a Line-API widget that paints cached, pre-rendered lines;
- `layout.py`: the sizes the layout follows; `app.tcss`: its stylesheet;
- `run.py`: the terminal made fit, and the app for one CLI run (`run_app`).

This package imports nothing itself. Never import typer or the CLI here.
"""

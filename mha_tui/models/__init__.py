"""Models trained by this repository, one plain file each, with their weights beside them.

Like `mha_tui/examples`, each file knows torch and nothing of mha-tui: no tracer, no tap, no
drawing. `mha_tui.load` builds them for `--model NAME`.
"""

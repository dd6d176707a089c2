"""The tutorials' attention modules, one plain file per tutorial, as a learner would write them.

Each file knows torch and nothing of mha-tui: no tracer, no tap, no drawing. A reader can
diff one against their own module. `mha_tui.load` builds them for `--model NAME`.
"""

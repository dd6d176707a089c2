"""recognise, for every caller of the pipeline: the stages of one recorded forward, and the
Trace built from them. Its own module so that the pipeline's parts (decode, hf) import it
without importing the pipeline's package (no import cycle, even through function-level
imports). Never import rich, textual or typer here.
"""

from __future__ import annotations

from ..records import ModuleInfo, Recorded, Stage, Trace


def stages_of(recorded: Recorded) -> tuple[Stage, ...]:
    """recognise: the stages of one recorded forward."""
    from ..recognise import recognise
    from .threads import one_blas_thread

    with one_blas_thread():  # the recomputed products beside torch's threads (threads.py)
        return recognise(recorded.recording, recorded.config, embedded=recorded.embedded,
                         forward_equal=recorded.forward_equal, n_params=recorded.n_params)


def recognised(recorded: Recorded) -> Trace:
    """recognise, then the Trace the app, the transcripts and the check read."""
    from ..ops.sizes import head_calls

    stages = stages_of(recorded)
    recording = recorded.recording
    # The heads ran as modules of their own (a ModuleList of heads) and the projection stage
    # shows them side by side.
    per_head = bool(head_calls(recording)) and any(s.kind == "project" for s in stages)
    info = ModuleInfo(class_name=recording.module_class, file=recording.module_file,
                      per_head_modules=per_head if recording.library == "torch" else False)
    return Trace(config=recorded.config, stages=stages, module=info, recording=recording)

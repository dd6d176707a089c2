"""Finding the submissions to grade: files, folders and globs, and each one's student id.

Never imports torch, rich, textual or typer.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_GLOB = re.compile(r"[*?\[]")


class GradeError(Exception):
    """A usage error before any submission runs (one line, exit code 2)."""


@dataclass(frozen=True)
class Submission:
    """One module to grade: a learner's FILE.py:Class (or package.module:Class), or a
    tutorial's --model NAME. `shown` is how the table names it."""

    shown: str
    module: str | None = None
    model: str | None = None

    @property
    def file(self) -> str | None:
        where = (self.module or "").rpartition(":")[0]
        return where if where.endswith(".py") else None


def student_ids(submissions: Sequence[Submission]) -> list[str]:
    """Each submission's student id, the documented pattern (docs/grading.md): its file's name
    without .py (`submissions/ada.py` -> `ada`); where several files share that name, as a glob
    over folders gives (`submissions/*/attn.py`), the name of its folder
    (`submissions/ada/attn.py` -> `ada`); a --model, its name. Still the same twice: `-2`,
    `-3` ... after the later ones, so that no two rows of a gradebook share an id."""
    def stem(sub: Submission) -> str:
        return Path(sub.file).stem if sub.file else (sub.module or sub.model or sub.shown)

    counts: dict[str, int] = {}
    for sub in submissions:
        counts[stem(sub)] = counts.get(stem(sub), 0) + 1
    ids, seen = [], set()
    for sub in submissions:
        name = stem(sub)
        if counts[name] > 1 and sub.file:
            name = Path(sub.file).parent.name or name
        unique, n = name, 1
        while unique in seen:
            n += 1
            unique = f"{name}-{n}"
        seen.add(unique)
        ids.append(unique)
    return ids


def is_batch(specs: Sequence[str]) -> bool:
    """A folder or a glob among the specs: grading, even when it holds one file."""
    return any(Path(spec.rpartition(":")[0] or spec).is_dir() or _GLOB.search(spec)
               for spec in specs)


def find_submissions(specs: Sequence[str], class_name: str | None) -> list[Submission]:
    """FILE.py[:Class], package.module:Class, a folder (its *.py files) or a glob, in the
    order given; a folder's and a glob's files sorted by name. Raises GradeError."""
    found: list[Submission] = []
    for spec in specs:
        where, sep, cls = spec.rpartition(":")
        if not sep or "/" in cls or cls.endswith(".py") or cls.startswith("*"):
            where, cls = spec, ""
        cls = cls or class_name or ""
        if Path(where).is_dir():
            files = sorted(str(p) for p in Path(where).glob("*.py") if p.name != "__init__.py")
            if not files:
                raise GradeError(f"{spec!r}: no .py files in this folder")
        elif _GLOB.search(where):
            files = sorted(glob.glob(where, recursive=True))
            files = [f for f in files if f.endswith(".py") and Path(f).is_file()]
            if not files:
                raise GradeError(f"{spec!r}: no .py file matches this pattern")
        else:
            files = [where]
        if not cls and where != files[0]:  # a folder or a pattern: one class for all its files
            raise GradeError(f"{spec!r} is a {'folder' if Path(where).is_dir() else 'pattern'}: "
                             "give --class CLASS, the class to look for in each of its .py files")
        for file in files:
            if not cls:
                raise GradeError(f"{file!r}: name the class, as FILE.py:Class, or give "
                                 "--class CLASS for every file")
            shown = file if class_name and cls == class_name else f"{file}:{cls}"
            found.append(Submission(shown=shown, module=f"{file}:{cls}"))
    return found

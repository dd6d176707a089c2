"""`python -m mha_tui.screenshots DIR`: the README's SVGs, from the app's own export.

Deterministic: the same trace, terminal size, theme and key presses every time.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .app import ExplainApp
from .config import Config
from .tracing import run_trace

SIZE = (100, 32)
# (file name, key presses from the first stage)
SHOTS = [
    ("01-embed.svg", []),
    ("02-project.svg", ["2"]),
    ("03-view.svg", ["3"]),
    ("04-transpose.svg", ["4"]),
    ("04b-transpose-wrong-view.svg", ["4", "w"]),
    ("07-mask.svg", ["7"]),
    ("08-softmax.svg", ["8"]),
    ("08b-softmax-head-1.svg", ["8", "tab", "tab"]),
    ("10-concat.svg", ["0"]),
    ("11-w_o.svg", ["end"]),
]


async def shoot(directory: Path) -> list[Path]:
    trace = run_trace(Config("I love AI !"))
    written = []
    for name, keys in SHOTS:
        app = ExplainApp(trace.config, trace=trace)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press(*keys)
            # Settle: background rendering done, then the frames it asked for (the footer
            # recomposes once the keys' enabled states are known).
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.pause()
            written.append(Path(app.save_screenshot(name, path=str(directory))))
    return written


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(shoot(directory)):
        print(path)


if __name__ == "__main__":
    main()

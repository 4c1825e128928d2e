"""Regenerate the README's screenshot: run the dashboard headless, wait for every scan, save an SVG.

    python -m hfcheck.tui.screenshot docs/tui.svg REFS... [--select REF] [--size 130x48]
    rsvg-convert -w 1560 docs/tui.svg -o docs/tui.png   # librsvg2-bin

The SVG is Textual's own screenshot, adjusted for SVG renderers that lack its web font (Fira
Code): a monospace font that every system has, and plain spaces kept as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


def renderable_svg(svg: str) -> str:
    svg = svg.replace("font-family: Fira Code, monospace;", 'font-family: "DejaVu Sans Mono", "Fira Code", monospace;')
    svg = svg.replace("<svg ", '<svg xml:space="preserve" ', 1)
    return svg.replace("&#160;", " ")


async def shoot(refs: list[str], select: str | None, size: tuple[int, int], timeout: float, scroll: int) -> str:
    from hfcheck.analyzer.sources.model_types import parse_refs
    from hfcheck.tui.app import Dashboard

    app = Dashboard(parse_refs(refs), jobs=2, timeout=120)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + timeout
        while app.counts()["done"] < len(app.entries) and time.monotonic() < deadline:
            await pilot.pause(0.2)
        await pilot.pause(0.3)
        if select:
            app.table.move_cursor(row=app.table.shown_keys.index(select), animate=False)
            await pilot.pause(0.3)
        if scroll:
            app.detail.scroll_to(y=scroll, animate=False)
            await pilot.pause(0.2)
        return app.export_screenshot()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hfcheck.tui.screenshot")
    parser.add_argument("out", help="the SVG to write")
    parser.add_argument("refs", nargs="+")
    parser.add_argument("--select", help="the row to highlight")
    parser.add_argument("--size", default="130x48", help="COLUMNSxLINES")
    parser.add_argument("--scroll", type=int, default=0, help="scroll the detail pane down this many lines")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    width, height = (int(n) for n in args.size.lower().split("x"))
    svg = asyncio.run(shoot(args.refs, args.select, (width, height), args.timeout, args.scroll))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(renderable_svg(svg))
    return 0


if __name__ == "__main__":
    sys.exit(main())

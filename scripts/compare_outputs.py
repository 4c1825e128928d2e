"""Are two runs' outputs the same, apart from what is measured anew each time?

For a refactoring that must not change behaviour: run ``hfcheck sweep --no-cache --format json``
or ``benchmarks/bench_port.py --json`` before and after, then

    python scripts/compare_outputs.py BEFORE.json AFTER.json

Wall-clock times, peak memory and source line numbers inside messages (``file.py:123``) are
left out; every other value is compared, and each difference is printed with its path. Exit
status 0 when none, 1 otherwise, 2 when a file cannot be read.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

MEASURED = frozenset({"timings_s", "seconds", "peak_rss_mib", "elapsed_s", "wall_s"})
LINE = re.compile(r"\.py:\d+")


def normalised(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        # bench_port's rows: keyed by (model, run), so their order does not matter
        if value and all(isinstance(v, dict) and {"model", "run"} <= set(v) for v in value):
            return {f"{v['model']} ({v['run']})": normalised(v) for v in value}
        return [normalised(v) for v in value]
    if isinstance(value, str):
        return LINE.sub(".py:N", value)
    return value


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    if type(before) is not type(after):
        return [f"{path or '/'}: {before!r:.200} -> {after!r:.200}"]
    if isinstance(before, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            where = f"{path}/{key}"
            if key not in after:
                out.append(f"{where}: only before")
            elif key not in before:
                out.append(f"{where}: only after")
            else:
                out += differences(before[key], after[key], where)
        return out
    if isinstance(before, list):
        out = [f"{path}: {len(before)} items -> {len(after)}"] if len(before) != len(after) else []
        for i, (b, a) in enumerate(zip(before, after)):
            out += differences(b, a, f"{path}[{i}]")
        return out
    return [] if before == after else [f"{path or '/'}: {before!r:.200} -> {after!r:.200}"]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: compare_outputs.py BEFORE.json AFTER.json", file=sys.stderr)
        return 2
    try:
        before, after = (normalised(json.loads(open(p, encoding="utf-8").read())) for p in argv)
    except (OSError, ValueError) as exc:
        print(f"compare_outputs: {exc}", file=sys.stderr)
        return 2
    found = differences(before, after)
    for line in found:
        print(line)
    size = len(before) if isinstance(before, (dict, list)) else 1
    print(f"{size} entries compared, {len(found)} difference(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

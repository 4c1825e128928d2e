"""Install one vLLM release from PyPI into its own virtual environment, as `pip install vllm==X` would.

Used by CI's cross-check stage (scripts/ci_crosscheck.sh) and the release drill
(scripts/vllm_release_drill.py). A requirement the package index cannot provide (vLLM 0.34.0
pins flashinfer-python==0.7.3, which is not on the index this machine reaches: a CUDA kernel
package nothing on a CPU imports) is left out, loudly, and the rest installed: the wheel with
``--no-deps``, then every other requirement of its METADATA (markers evaluated here). Prints the
requirements left out, one per line, prefixed ``LEFT OUT:``; exit 1 when vLLM cannot be installed.

    python scripts/vllm_env.py 0.34.0 .venv-vllm [--wheel-dir DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MAX_LEFT_OUT = 3


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without extras, markers evaluated for this interpreter."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        lines = whl.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(str(req))
    return out


def unavailable(stderr: str) -> str | None:
    """The requirement pip could not find on the index ('No matching distribution found for X')."""
    m = re.search(r"No matching distribution found for ([^\s(]+)", stderr)
    return m.group(1) if m else None


def install(version: str, venv: Path, wheel_dir: Path | None) -> list[str]:
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if run([*pip, f"vllm=={version}"]).returncode == 0:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        where = wheel_dir or Path(tmp)
        wheel = next(iter(where.glob(f"vllm-{version}-*.whl")), None)
        if wheel is None:
            got = run([str(python), "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d", str(where)])
            wheel = next(iter(where.glob(f"vllm-{version}-*.whl")), None)
            if wheel is None:
                raise SystemExit(f"vLLM {version} could not be downloaded: {got.stderr.strip().splitlines()[-1:]}")
        run([*pip, "packaging"])
        reqs = requirements(wheel)
        left_out: list[str] = []
        while True:
            proc = run([*pip, *reqs])
            if proc.returncode == 0:
                break
            missing = unavailable(proc.stderr)
            name = re.split(r"[<>=!~ \[]", missing or "", maxsplit=1)[0].lower()
            if not missing or len(left_out) >= MAX_LEFT_OUT or not any(r.lower().startswith(name) for r in reqs):
                raise SystemExit(f"vLLM {version}'s requirements do not install: {proc.stderr.strip().splitlines()[-1:]}")
            left_out += [r for r in reqs if r.lower().startswith(name)]
            reqs = [r for r in reqs if not r.lower().startswith(name)]
        if run([*pip, "--no-deps", str(wheel)]).returncode != 0:
            raise SystemExit(f"the vLLM {version} wheel does not install")
        return left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version")
    parser.add_argument("venv", type=Path)
    parser.add_argument("--wheel-dir", type=Path, default=None, help="a folder that may already hold the wheel")
    args = parser.parse_args()
    for req in install(args.version, args.venv, args.wheel_dir):
        print(f"LEFT OUT: {req} (not on the package index here)")


if __name__ == "__main__":
    main()

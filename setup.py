"""The package list, found rather than listed: every package under each folder pyproject.toml's
``package-dir`` maps into the ``hfcheck`` namespace (the card's top-level folders are
``hfcheck.analyzer``, ``hfcheck.porter``...). A hand-kept list once shipped two subpackages as
data only; setuptools' own discovery cannot map several folders into one namespace."""

from pathlib import Path

import tomllib
from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
PACKAGES = sorted({name for prefix, folder in PACKAGE_DIR.items()
                   for name in (prefix, *(f"{prefix}.{sub}" for sub in find_packages(str(ROOT / folder))))})

setup(packages=PACKAGES)

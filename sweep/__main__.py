"""``python -m hfcheck.sweep [REFS...]``: the same as ``hfcheck sweep``."""

from hfcheck.shared.command import module_main
from hfcheck.sweep.cli import add_parser, run


def main(argv: list[str] | None = None) -> int:
    return module_main("sweep", add_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

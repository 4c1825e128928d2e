"""``python -m hfcheck.sweep [REFS...]``: the same as ``hfcheck sweep``."""

import argparse
import sys

from hfcheck.shared.command import interrupted
from hfcheck.sweep.cli import add_parser, run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hfcheck")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["sweep", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    raise SystemExit(main())

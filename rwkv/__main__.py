"""``python -m rwkv {chat,generate,convert,serve} ...`` (also installed as the ``rwkv`` command).

``main(argv)`` returns the exit status instead of exiting, so other programs can call it.
"""

import argparse
import importlib
import sys


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand of ``rwkv.cli.COMMANDS``."""
    from .cli import COMMANDS

    parser = argparse.ArgumentParser(prog="python -m rwkv", description="RWKV language model programs")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv=None) -> int:
    """Runs one program; returns its exit status (0 ok, 2 a usage or input error, 130 interrupted)."""
    from .cli.common import CliError

    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help and on bad options: report, do not exit
        return e.code if isinstance(e.code, int) else 2
    if not getattr(ns, "run", None):
        parser.print_help()
        return 2
    try:
        return ns.run(ns)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m rwkv {chat,generate,serve} ...`` (also installed as the ``rwkv`` command)."""

import argparse
import sys


def main(argv=None):
    from .cli import chat, generate, serve
    from .cli.common import CliError

    parser = argparse.ArgumentParser(prog="python -m rwkv", description="RWKV language model programs")
    sub = parser.add_subparsers(dest="command", metavar="{chat,generate,serve}")
    chat.add_parser(sub)
    generate.add_parser(sub)
    serve.add_parser(sub)
    ns = parser.parse_args(argv)
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

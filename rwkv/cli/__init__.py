"""The programs behind ``python -m rwkv`` (also installed as the ``rwkv`` command).

Each subcommand is a module with ``add_parser(subparsers)``, which adds its parser and sets
``run(namespace) -> exit status`` as the parser's default. ``COMMANDS`` lists them in the order
``--help`` shows them; a new program is one module and one entry here.
"""

COMMANDS = {
    "chat": "rwkv.cli.chat",
    "generate": "rwkv.cli.generate",
    "convert": "rwkv.cli.convert",
    "serve": "rwkv.cli.serve",
}

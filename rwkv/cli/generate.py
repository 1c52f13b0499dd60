"""``python -m rwkv generate``: continue a prompt and stream the text to stdout."""

import sys

from . import common


def add_parser(sub):
    """Adds the ``generate`` subcommand to ``sub`` (argparse subparsers)."""
    p = sub.add_parser("generate", help="generate text from a prompt", description=__doc__.strip("`. "))
    common.add_model_options(p)
    common.add_vocab_option(p)
    p.add_argument("--prompt", required=True, help="the text to continue ('\\n' typed literally is a "
                   "newline); use '-' to read it from stdin")
    p.add_argument("--tokens", type=int, default=100, help="how many tokens to generate (default 100)")
    common.add_sampling_options(p, temperature=1.0, top_p=0.85, presence=0.2, frequency=0.2)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.set_defaults(run=run)
    return p


def run(ns):
    """Runs the program for the parsed options ``ns``; returns the exit status."""
    prompt = sys.stdin.read() if ns.prompt == "-" else ns.prompt.replace("\\n", "\n")
    if ns.tokens < 0:
        common.write("error: --tokens must be >= 0\n", sys.stderr)
        return 2
    pipe = common.load_pipeline(ns)
    args = common.pipeline_args(ns, token_stop=[0])
    stream = pipe.generate_stream(prompt, ns.tokens, args, stop=ns.stop, generator=ns.seed)
    for piece in stream:
        common.write(piece)
    common.write("\n")
    return 0

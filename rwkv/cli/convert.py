"""``python -m rwkv convert``: write a checkpoint pre-converted for one strategy.

The file is upstream's ``convert_and_save_and_exit`` format (``rwkv.model.convert_checkpoint``):
weights already cast, quantized and rescaled for the strategy, so loading it skips that work.
Upstream loads such files for v4/v5.x; this package loads them for every version. Unlike
upstream's keyword, nothing exits: the program returns when the file is written.
"""

from .common import CliError, add_model_options, write


def add_parser(sub):
    """Adds the ``convert`` subcommand to ``sub`` (argparse subparsers)."""
    p = sub.add_parser("convert", help="pre-convert a checkpoint for a strategy",
                       description=__doc__.strip("`. \n").split("\n\n")[0])
    add_model_options(p, model_required=True)
    p.add_argument("--output", "-o", required=True, help="the file to write (.pth appended when missing)")
    p.add_argument("--rescale-layer", type=int, default=None,
                   help="upstream's RESCALE_LAYER for fp16 strategies (default: upstream's rule)")
    p.set_defaults(run=run)
    return p


def run(ns):
    """Runs the program for the parsed options ``ns``; returns the exit status."""
    from ..model import convert_checkpoint
    try:
        out = convert_checkpoint(ns.model, ns.strategy, ns.output, rescale_layer=ns.rescale_layer)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise CliError(f"cannot convert {ns.model!r} for strategy {ns.strategy!r}: {e}") from None
    write(f"wrote {out} (strategy {ns.strategy!r})\n")
    return 0

"""Options and model loading shared by the programs."""

import sys

WORLD = "rwkv_vocab_v20230424"


class CliError(Exception):
    """A user-facing error: printed as ``error: ...`` with exit status 2, no traceback."""


def add_model_options(p):
    p.add_argument("--model", required=True, help="checkpoint path (.pth optional, as for RWKV(model=...))")
    p.add_argument("--strategy", default="cpu fp32", help="strategy string, e.g. 'cpu fp32' or "
                   "'cuda fp16' (default: cpu fp32)")
    p.add_argument("--vocab", default=WORLD, help=f"tokenizer: {WORLD!r} (default), 'cl100k_base' or a "
                   "tokenizers JSON path such as 20B_tokenizer.json")


def add_sampling_options(p, *, temperature, top_p, presence, frequency):
    p.add_argument("--temperature", type=float, default=temperature, help=f"default {temperature}")
    p.add_argument("--top_p", "--top-p", type=float, default=top_p, help=f"default {top_p}")
    p.add_argument("--top_k", "--top-k", type=int, default=0, help="default 0 (off)")
    p.add_argument("--presence", type=float, default=presence, help=f"presence penalty, default {presence}")
    p.add_argument("--frequency", type=float, default=frequency,
                   help=f"frequency penalty, default {frequency}")
    p.add_argument("--seed", type=int, default=None, help="random seed for repeatable output")


def pipeline_args(ns, **extra):
    from ..utils import PIPELINE_ARGS
    if ns.temperature < 0:
        raise CliError(f"--temperature must be >= 0, got {ns.temperature}")
    return PIPELINE_ARGS(temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
                         alpha_presence=ns.presence, alpha_frequency=ns.frequency, **extra)


def load_pipeline(ns):
    """Build the model and the PIPELINE; turn the expected failures into CliError."""
    from ..model import RWKV
    from ..utils import PIPELINE
    try:
        model = RWKV(model=ns.model, strategy=ns.strategy, verbose=False)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise CliError(f"cannot load model {ns.model!r} with strategy {ns.strategy!r}: {e}") from None
    try:
        return PIPELINE(model, ns.vocab)
    except (OSError, ValueError, ImportError) as e:
        raise CliError(str(e)) from None


def write(text, stream=None):
    stream = stream or sys.stdout
    stream.write(text)
    stream.flush()

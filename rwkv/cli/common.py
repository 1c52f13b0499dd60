"""Options and model loading shared by the programs."""

import sys
from pathlib import Path

WORLD = "rwkv_vocab_v20230424"
#: The small model shipped in a source checkout (models/rwkv7-tiny/), the programs' default.
SHIPPED_MODEL = Path(__file__).resolve().parents[2] / "models" / "rwkv7-tiny" / "rwkv7-tiny"
#: The tokenizer file looked for beside a checkpoint when --vocab is not given.
TOKENIZER_BESIDE = "tokenizer.json"


class CliError(Exception):
    """A user-facing error: printed as ``error: ...`` with exit status 2, no traceback."""


def add_model_options(p, *, model_required=False):
    """--model (default: the shipped model, unless ``model_required``) and --strategy."""
    if model_required:
        p.add_argument("--model", required=True, help="checkpoint path (.pth optional, as for RWKV(model=...))")
    else:
        p.add_argument("--model", default=None, help="checkpoint path (.pth optional, as for RWKV(model=...)); "
                       "default: the shipped models/rwkv7-tiny/rwkv7-tiny")
    p.add_argument("--strategy", default="cpu fp32", help="strategy string, e.g. 'cpu fp32' or "
                   "'cuda fp16' (default: cpu fp32)")


def add_vocab_option(p):
    """--vocab (default: the tokenizer beside the checkpoint, else World)."""
    p.add_argument("--vocab", default=None, help=f"tokenizer: {WORLD!r} (World), 'cl100k_base' or a "
                   "tokenizers JSON path such as 20B_tokenizer.json; default: the "
                   f"{TOKENIZER_BESIDE} beside the checkpoint when there is one, else {WORLD!r}")


def add_sampling_options(p, *, temperature, top_p, presence, frequency):
    """--temperature, --top_p, --top_k, --presence, --frequency and --seed, with these defaults."""
    p.add_argument("--temperature", type=float, default=temperature, help=f"default {temperature}")
    p.add_argument("--top_p", "--top-p", type=float, default=top_p, help=f"default {top_p}")
    p.add_argument("--top_k", "--top-k", type=int, default=0, help="default 0 (off)")
    p.add_argument("--presence", type=float, default=presence, help=f"presence penalty, default {presence}")
    p.add_argument("--frequency", type=float, default=frequency,
                   help=f"frequency penalty, default {frequency}")
    p.add_argument("--seed", type=int, default=None, help="random seed for repeatable output")


def pipeline_args(ns, **extra):
    """PIPELINE_ARGS from the sampling options (and ``extra``); CliError for a negative temperature."""
    from ..utils import PIPELINE_ARGS
    if ns.temperature < 0:
        raise CliError(f"--temperature must be >= 0, got {ns.temperature}")
    return PIPELINE_ARGS(temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
                         alpha_presence=ns.presence, alpha_frequency=ns.frequency, **extra)


def model_path(model):
    """``model`` (None: the shipped model), or CliError when None and no model is shipped."""
    if model is not None:
        return str(model)
    if SHIPPED_MODEL.with_suffix(".pth").exists():
        return str(SHIPPED_MODEL)
    raise CliError(f"no --model given, and the shipped model is not at {SHIPPED_MODEL}.pth "
                   "(it comes with a source checkout); pass --model PATH")


def vocab_for(model, vocab=None):
    """The tokenizer to use with checkpoint ``model``: ``vocab`` when given, else the
    tokenizer.json in the checkpoint's folder when there is one, else the World vocabulary."""
    if vocab is not None:
        return vocab
    beside = Path(model).expanduser().resolve().parent / TOKENIZER_BESIDE
    return str(beside) if beside.is_file() else WORLD


def check_vocab_fits(pipe, model, vocab):
    """CliError, saying how to fix it, when the tokenizer makes ids the model has no embedding for."""
    tokens, rows = pipe.vocab_size_of_tokenizer(), pipe.model_vocab_size()
    if rows is not None and tokens > rows:
        raise CliError(
            f"the tokenizer {vocab!r} has {tokens} tokens, but the model {model!r} has a vocabulary of "
            f"{rows} (ids 0..{rows - 1}), so its ids would be out of range. Pass --vocab with the "
            f"model's own tokenizer: a tokenizers JSON file (the {TOKENIZER_BESIDE} shipped beside a "
            f"checkpoint is used when --vocab is not given), or {WORLD} for RWKV World models")


def load_pipeline(ns):
    """Build the model and the PIPELINE (``ns.model``, ``ns.strategy``, ``ns.vocab``) and check
    that the tokenizer fits the model; turn the expected failures into CliError."""
    from ..model import RWKV
    from ..utils import PIPELINE
    model = model_path(ns.model)
    vocab = vocab_for(model, ns.vocab)
    try:
        rwkv = RWKV(model=model, strategy=ns.strategy, verbose=False)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise CliError(f"cannot load model {model!r} with strategy {ns.strategy!r}: {e}") from None
    try:
        pipe = PIPELINE(rwkv, vocab)
    except (OSError, ValueError, ImportError) as e:
        raise CliError(str(e)) from None
    check_vocab_fits(pipe, model, vocab)
    return pipe


def write(text, stream=None):
    """Writes and flushes (stdout by default), so streamed text shows at once."""
    stream = stream or sys.stdout
    stream.write(text)
    stream.flush()

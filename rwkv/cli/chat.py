"""``python -m rwkv chat``: interactive chat with streaming output and a prefix-state cache.

Conversation format (RWKV World): ``User: {message}\\n\\nAssistant: {reply}\\n\\n``. The conversation is
kept as token ids; every turn asks the ``PrefixCache`` for the longest processed prefix, so a new turn
feeds only its own new tokens through the model, and ``+retry`` feeds none for the prompt.

Commands: ``+reset`` (forget the conversation), ``+retry`` / ``+regenerate`` / ``+`` (a new reply to
the last message), ``/quit`` (or end of input). A literal ``\\n`` in a message becomes a newline.
Reads lines with prompt_toolkit when it is installed and stdin is a terminal, else with ``input()``,
so piped stdin works (one message per line).
"""

import sys

from ..generation import PrefixCache
from .common import (
    CliError,
    add_model_options,
    add_sampling_options,
    add_vocab_option,
    load_pipeline,
    pipeline_args,
    write,
)

RETRY = ("+retry", "+regenerate", "+")
QUIT = ("/quit", "/exit")


class ChatSession:
    """The conversation state machine behind the program (usable without a terminal)."""

    def __init__(self, pipeline, args, *, max_tokens=500, cache=None, generator=None, init_prompt="",
                 user="User", bot="Assistant"):
        self.pipeline, self.args, self.max_tokens = pipeline, args, int(max_tokens)
        self.cache = cache if cache is not None else PrefixCache(max_entries=8, max_bytes=1 << 30)
        self.generator = generator
        self.user, self.bot = user, bot
        self.init_tokens = pipeline.encode(init_prompt) if init_prompt else []
        self.history = list(self.init_tokens)  # tokens the conversation consists of so far
        self.last_prompt = None                # tokens of the last turn's prompt (for retry)
        self.last_result = None

    def reset(self):
        """Forget the conversation (back to the initial prompt, if any)."""
        self.history, self.last_prompt, self.last_result = list(self.init_tokens), None, None

    def send(self, message):
        """Start a turn; returns the stream of reply pieces (a GenerationStream)."""
        message = message.replace("\\n", "\n").replace("\r\n", "\n").strip()
        prompt = self.history + self.pipeline.encode(f"{self.user}: {message}\n\n{self.bot}:")
        return self._reply(prompt)

    def retry(self):
        """A new reply to the last message (its prompt is fully cached); CliError before any."""
        if self.last_prompt is None:
            raise CliError("nothing to retry yet")
        return self._reply(self.last_prompt)

    def _reply(self, prompt):
        self.last_prompt = prompt
        stream = self.pipeline.generate_stream(prompt, self.max_tokens, self.args, stop=["\n\n"],
                                               cache=self.cache, generator=self.generator)
        return _Turn(self, stream, prompt)

    def _finish(self, prompt, result):
        self.last_result = result
        self.history = prompt + result.tokens
        if result.stop_reason != "stop_string":  # keep the turn separator in the conversation
            self.history += self.pipeline.encode("\n\n")


class _Turn:
    """Iterates the reply pieces and records the finished turn in the session."""

    def __init__(self, session, stream, prompt):
        self.session, self.stream, self.prompt = session, stream, prompt

    def __iter__(self):
        yield from self.stream
        self.session._finish(self.prompt, self.stream.result)

    @property
    def result(self):
        return self.stream.result


def _line_reader():
    if sys.stdin.isatty():
        try:
            from prompt_toolkit import PromptSession
            session = PromptSession()
            return lambda: session.prompt("User: ")
        except ImportError:
            return lambda: input("User: ")
    return lambda: input()


def add_parser(sub):
    """Adds the ``chat`` subcommand to ``sub`` (argparse subparsers)."""
    p = sub.add_parser("chat", help="interactive chat (streaming, prefix cache, +reset, +retry, /quit)",
                       description=__doc__.split("\n\n")[0])
    add_model_options(p)
    add_vocab_option(p)
    add_sampling_options(p, temperature=1.0, top_p=0.3, presence=0.5, frequency=0.5)
    p.add_argument("--max-tokens", type=int, default=500, help="longest reply in tokens (default 500)")
    p.add_argument("--init", default="", help="text that starts the conversation (e.g. a system prompt)")
    p.add_argument("--cache-mb", type=int, default=1024, help="prefix cache budget in MB (default 1024)")
    p.add_argument("--stats", action="store_true",
                   help="after each reply print token counts (prompt, cached, fed, generated) to stderr")
    p.set_defaults(run=run)
    return p


def run(ns):
    """Runs the chat loop on stdin and stdout; returns the exit status."""
    import numpy as np
    pipe = load_pipeline(ns)
    args = pipeline_args(ns, token_stop=[0])
    generator = np.random.RandomState(ns.seed) if ns.seed is not None else None
    session = ChatSession(pipe, args, max_tokens=ns.max_tokens, generator=generator, init_prompt=ns.init,
                          cache=PrefixCache(max_entries=8, max_bytes=ns.cache_mb << 20))
    read = _line_reader()
    interactive = sys.stdin.isatty()
    if interactive:
        write("Commands: +reset, +retry, /quit\n")
    while True:
        try:
            line = read()
        except (EOFError, KeyboardInterrupt):
            break
        msg = line.strip()
        if not msg:
            continue
        if msg in QUIT:
            break
        if msg == "+reset":
            session.reset()
            write("[conversation reset]\n")
            continue
        try:
            turn = session.retry() if msg in RETRY else session.send(msg)
            write(f"{session.bot}:")
            for piece in turn:
                write(piece)
            write("\n")
        except CliError as e:
            write(f"[{e}]\n")
            continue
        except (ValueError, IndexError) as e:  # e.g. a token outside a small model's vocabulary
            write(f"\n[error: {e}]\n")
            continue
        if ns.stats:
            r = turn.result
            write(f"[stats] prompt={r.prompt_tokens} cached={r.cached_tokens} fed={r.forward_tokens} "
                  f"generated={len(r.tokens)} stop={r.stop_reason}\n", sys.stderr)
    return 0

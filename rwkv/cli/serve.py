"""``python -m rwkv serve``: the OpenAI-compatible server (rwkv/serve/), on uvicorn or Ray Serve."""

from __future__ import annotations

from .common import CliError


def add_parser(sub):
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       description="Serve a model over OpenAI's API (/v1/completions, /v1/chat/completions, "
                       "/v1/models, /health, /metrics) with continuous batching.")
    p.add_argument("--model", default="", help="checkpoint path (default: the model shipped in models/)")
    p.add_argument("--strategy", default="cpu fp32", help="strategy string (default: cpu fp32)")
    p.add_argument("--tokenizer", "--vocab", default=None, help="tokenizers JSON path or rwkv_vocab_v20230424 "
                   "(default: the tokenizer.json beside the model, else the World vocabulary)")
    p.add_argument("--model-name", default=None, help="the model's name in the API (default: the file name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--max-batch", type=int, default=32, help="sequences decoded together (default: 32)")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting for a slot before 429 "
                   "(default: 256)")
    p.add_argument("--max-prompt-tokens", type=int, default=8192, help="longest prompt (default: 8192)")
    p.add_argument("--max-tokens", type=int, default=4096, help="largest max_tokens a request may ask "
                   "for (default: 4096)")
    p.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens of a request that gives "
                   "none (default: 256)")
    p.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens prefilled per step, "
                   "between decode steps (default: 256)")
    p.add_argument("--cache-mb", type=int, default=1024, help="prefix-state cache budget in MiB, 0 turns "
                   "it off (default: 1024)")
    p.add_argument("--system-prompt", default="", help="system prompt for chat requests that have none")
    p.add_argument("--user-name", default="User", help="chat format: the user's name (default: User)")
    p.add_argument("--assistant-name", default="Assistant", help="chat format: the assistant's name "
                   "(default: Assistant)")
    p.add_argument("--ray", action="store_true", help="run as Ray Serve replicas (needs ray[serve])")
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (e.g. ray://head:10001 or "
                   "auto); default: start a local one")
    p.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default: 1)")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas")
    p.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas")
    p.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscaling: requests in flight per replica to aim for (default: max-batch)")
    p.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica "
                   "(default: 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per engine (Ray replicas: "
                   "default 1 each)")
    p.set_defaults(run=run)
    return p


def config_from(ns):
    from ..serve.server import ServeConfig

    for name in ("max_batch", "max_queue", "max_prompt_tokens", "max_tokens", "default_max_tokens",
                 "prefill_chunk", "port", "replicas"):
        if getattr(ns, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(ns, name)}")
    if ns.cache_mb < 0:
        raise CliError(f"--cache-mb must be >= 0, got {ns.cache_mb}")
    return ServeConfig(model=ns.model, strategy=ns.strategy, tokenizer=ns.tokenizer, model_name=ns.model_name,
                       max_batch=ns.max_batch, max_queue=ns.max_queue, max_prompt_tokens=ns.max_prompt_tokens,
                       max_tokens=ns.max_tokens, default_max_tokens=min(ns.default_max_tokens, ns.max_tokens),
                       prefill_chunk=ns.prefill_chunk, cache_bytes=ns.cache_mb << 20,
                       system_prompt=ns.system_prompt, user_name=ns.user_name,
                       assistant_name=ns.assistant_name)


def run(ns) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise CliError("serving needs the serve extra: pip install 'rwkv[serve]'") from None
    cfg = config_from(ns)
    if ns.ray:
        from ..serve.ray_app import run_ray

        return run_ray(cfg, ns)
    import torch

    from ..serve import Server, build_app

    if ns.threads:
        torch.set_num_threads(ns.threads)
    try:
        server = Server(cfg)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise CliError(f"cannot start the server: {e}") from None
    print(f"serving {server.config.model_name} ({server.config.strategy}) on http://{ns.host}:{ns.port}/v1",
          flush=True)
    try:
        uvicorn.run(build_app(server), host=ns.host, port=ns.port, log_level="warning")
    finally:
        server.close()
    return 0

"""An OpenAI-compatible server with continuous batching (``python -m rwkv serve``).

Data flow: an HTTP request (rwkv/serve/app.py, FastAPI) is checked and tokenized into a ``Job``
(rwkv/serve/server.py), queued, and run by the engine thread (rwkv/serve/scheduler.py), which
steps a ``rwkv.engine.BatchDecoder`` for every request in flight; each step's logits are turned
into tokens (rwkv/serve/sampler.py) and text pieces that flow back to the request as events.
rwkv/serve/ray_app.py runs the same app as Ray Serve replicas.

Needs the ``serve`` extra: ``pip install rwkv[serve]`` (FastAPI, uvicorn, sse-starlette,
prometheus-client); Ray Serve for ``--ray``: ``pip install rwkv[ray]``.
"""

from .server import ServeConfig, Server

__all__ = ["ServeConfig", "Server", "build_app"]


def build_app(server, **kw):
    """The FastAPI app of a ``Server`` (see rwkv/serve/app.py)."""
    from .app import build_app as build

    return build(server, **kw)

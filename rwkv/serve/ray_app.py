"""The same server as Ray Serve replicas (``python -m rwkv serve --ray``): one engine per replica,
Ray Serve's HTTP proxy in front, routing each request to a replica; replica count fixed
(``--replicas``) or autoscaled (``--min-replicas``/``--max-replicas``, on requests in flight).

Without ``--ray-address`` a local Ray instance is started for the command's lifetime; with it the
deployment joins an existing cluster (``auto`` for the one this machine belongs to, or
``ray://head:10001``), where Ray places the replicas on any of its nodes.
"""

from __future__ import annotations

import signal
import sys
import time

from ray import serve

from .app import build_app
from .server import ServeConfig, Server


@serve.ingress()
class RWKVServer:
    """One replica: a model, its engine thread, and the FastAPI app in front of them."""

    def __init__(self, config: dict, threads: int | None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.server = Server(ServeConfig(**config))

    def __serve_build_asgi_app__(self):
        return build_app(self.server)

    def __del__(self):
        server = getattr(self, "server", None)
        if server is not None:
            server.close()


def deployment_options(cfg: ServeConfig, ns) -> dict:
    """Ray Serve options from the command line: replicas or autoscaling, and how many requests a
    replica takes at once (its batch and its queue: the replica's own 429 answers beyond)."""
    opts = {"max_ongoing_requests": cfg.max_batch + cfg.max_queue,
            "ray_actor_options": {"num_cpus": ns.replica_cpus}}
    if ns.min_replicas is not None or ns.max_replicas is not None:
        lo = ns.min_replicas if ns.min_replicas is not None else 1
        hi = ns.max_replicas if ns.max_replicas is not None else max(lo, ns.replicas)
        if not 0 <= lo <= hi or hi < 1:
            raise ValueError(f"--min-replicas {lo} and --max-replicas {hi}: need 0 <= min <= max, max >= 1")
        opts["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": max(lo, 1),
                                      "target_ongoing_requests": ns.target_ongoing_requests or cfg.max_batch}
    else:
        opts["num_replicas"] = ns.replicas
    return opts


def run_ray(cfg: ServeConfig, ns) -> int:
    import ray

    resolved = cfg.resolved()
    opts = deployment_options(resolved, ns)
    if ns.ray_address:
        ray.init(address=ns.ray_address, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=256 << 20)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        serve.start(http_options={"host": ns.host, "port": ns.port})
        app = RWKVServer.options(**opts).bind(resolved.__dict__, ns.threads or 1)
        serve.run(app, name="rwkv", route_prefix="/")
        print(f"serving {resolved.model_name} ({resolved.strategy}) on Ray Serve at "
              f"http://{ns.host}:{ns.port}/v1", flush=True)
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        # On a cluster of one's own only this deployment goes; a local instance goes whole (its
        # processes with it: no waiting for the proxies' drain period first).
        try:
            if ns.ray_address:
                serve.delete("rwkv")
        finally:
            ray.shutdown()


RWKVServer = serve.deployment(name="rwkv")(RWKVServer)

__all__ = ["RWKVServer", "run_ray", "deployment_options"]
if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it with: python -m rwkv serve --ray")

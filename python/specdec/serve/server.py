"""Running the app under uvicorn: bind, serve, and on SIGINT or SIGTERM stop taking
connections, let requests in flight finish (``grace`` seconds, then cancel them) and
return, so the process exits 0."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn

from .app import create_app
from .engine import Engine, EngineConfig

__all__ = ["run_server"]

log = logging.getLogger("specdec.serve")


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises a caught signal once it has shut down (the process would end
        # by that signal); a server stopped on purpose exits 0.
        self._captured_signals.clear()


def run_server(
    config: EngineConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    grace: float = 30.0,
    log_level: str = "info",
) -> int:
    """Load the model, serve until SIGINT or SIGTERM, return 0."""
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    engine = Engine(config)
    log.info(
        "%s: drafter %s, budget %s, max batch %d, KV pool %d tokens, one request up to %d tokens",
        engine.model_name,
        config.drafter,
        config.budget,
        config.max_batch,
        engine.generator.kv_tokens,
        engine.generator.max_new_tokens_for(1) + 1,
    )
    app = create_app(engine, api_key=api_key, grace=grace)
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=max(int(grace), 1),
            access_log=False,
        )
    )
    server.run()
    return 0

"""Start the server: verify and load the model, warm the engine up, then bind.

Loading before binding means a version that fails verification never answers a request: the
process exits non-zero with the reason, which is what a supervisor (systemd, k8s) needs to see.
"""

from __future__ import annotations

import logging
import threading

from aieng.engine import Engine, EngineConfig, GenerationRequest, GenerationResult, SamplingParams
from aieng.loading.loader import LoadConfig, load_version
from aieng.server.app import ServerState, create_app
from aieng.settings import Settings
from aieng.store import ModelStore, parse_ref

log = logging.getLogger("aieng.server")


class SerialEngine:
    """One request at a time through the engine (the scheduler replaces this with continuous batching)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Lock()

    def count_tokens(self, prompt: str) -> int:
        return len(self.engine.encode(prompt))

    def generate(self, prompt: str, params: SamplingParams) -> GenerationResult:
        ids = self.engine.encode(prompt)
        self.engine.check(GenerationRequest("check", ids, params))  # 400 before taking the lock
        with self._lock:
            return self.engine.generate([ids], params)[0]


def build_state(settings: Settings, engine_config: EngineConfig = EngineConfig()) -> ServerState:
    """Verify, load and warm up the configured model; raises an AiengError if it must not be served."""
    store = ModelStore(settings.store)
    loaded = load_version(store, parse_ref(settings.model), LoadConfig.from_settings(settings))
    log.info("loaded %s@%s in %.2fs on %s (%s)", loaded.name, loaded.version, loaded.load_seconds, loaded.device,
             loaded.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, context_length=loaded.context_length, config=engine_config)
    log.info("engine warm-up took %.2fs", engine.warmup())
    state = ServerState(generator=SerialEngine(engine), model_name=loaded.name, model_version=loaded.version)
    state.ready = True
    return state


def serve(settings: Settings) -> None:
    import uvicorn

    state = build_state(settings)
    app = create_app(state, max_body_bytes=settings.max_body_bytes)
    log.info("serving %s@%s on http://%s:%d", state.model_name, state.model_version, settings.host, settings.port)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False)

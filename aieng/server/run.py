"""Start the server: verify and load the model first, then bind.

Loading before binding means a version that fails verification never answers a request: the
process exits non-zero with the reason, which is what a supervisor (systemd, k8s) needs to see.
"""

from __future__ import annotations

import logging

from aieng.engine import ReferenceGenerator
from aieng.loading.loader import LoadConfig, load_version
from aieng.server.app import ServerState, create_app
from aieng.settings import Settings
from aieng.store import ModelStore, parse_ref

log = logging.getLogger("aieng.server")


def build_state(settings: Settings) -> ServerState:
    """Verify, load and warm up the configured model; raises an AiengError if it must not be served."""
    store = ModelStore(settings.store)
    loaded = load_version(store, parse_ref(settings.model), LoadConfig.from_settings(settings))
    log.info("loaded %s@%s in %.2fs on %s (%s)", loaded.name, loaded.version, loaded.load_seconds, loaded.device,
             loaded.dtype)
    generator = ReferenceGenerator(loaded.model, loaded.tokenizer, context_length=loaded.context_length,
                                   device=loaded.device)
    generator.warmup()
    state = ServerState(generator=generator, model_name=loaded.name, model_version=loaded.version)
    state.ready = True
    return state


def serve(settings: Settings) -> None:
    import uvicorn

    state = build_state(settings)
    app = create_app(state, max_body_bytes=settings.max_body_bytes)
    log.info("serving %s@%s on http://%s:%d", state.model_name, state.model_version, settings.host, settings.port)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False)

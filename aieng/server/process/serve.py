"""``aieng serve``: verify and load in the master, then run gunicorn with uvicorn workers.

A version that fails verification never answers a request: ``prepare()`` raises before gunicorn
starts, the CLI prints the reason on one line and exits 1, which is what a supervisor needs.
"""

from __future__ import annotations

import logging

from gunicorn.app.base import BaseApplication

from aieng.server.http.app import create_app
from aieng.server.process.runtime import Runtime, RuntimeConfig
from aieng.server.process.worker_plan import plan_for_model
from aieng.settings import Settings

log = logging.getLogger("aieng.server")


class GunicornApplication(BaseApplication):
    def __init__(self, app, options: dict):
        self.application = app
        self.options = options
        super().__init__()

    def load_config(self):
        from aieng.server.process import gunicorn_conf

        conf = {k: v for k, v in vars(gunicorn_conf).items() if k in self.cfg.settings}
        for key, value in {**conf, **self.options}.items():
            self.cfg.set(key, value)

    def load(self):
        return self.application


def serve(settings: Settings) -> None:
    runtime = Runtime(RuntimeConfig.from_settings(settings))
    runtime.prepare()  # raises AiengError (verification, memory budget, remote code) before any fork
    plan = plan_for_model(settings, runtime.loaded)
    runtime.config.torch_threads = plan.torch_threads
    warmed = runtime.warm_before_fork()
    if warmed is not None:
        log.info("engine warmed up before fork in %.1fs%s; workers share it", warmed,
                 " (torch.compile included)" if runtime.engine.compiled else "")
    log.info("serving %s@%s on http://%s:%d with %d worker(s) x %d torch thread(s): %s", runtime.model_name,
             runtime.model_version, settings.host, settings.port, plan.workers, plan.torch_threads, plan.reason)
    app = create_app(runtime, max_body_bytes=settings.max_body_bytes)
    options = {"bind": f"{settings.host}:{settings.port}", "workers": plan.workers,
               "graceful_timeout": settings.graceful_timeout_s, "loglevel": settings.log_level}
    GunicornApplication(app, options).run()

"""A canary version served beside the stable one, in every worker, with a share of the traffic.

Each worker keeps two ``Serving``s: ``runtime.serving`` (the store's ``current``) and, while the
store has a canary record (``aieng.store.canary_record``), ``runtime.canary``. The canary has an engine
and an engine thread of its own: the two versions run side by side and neither's rows wait on
the other's steps, and its compiled graphs and weight-format plan come from the stable engine
(``Engine(..., replacing=)``), so loading a canary compiles nothing. Its KV cache is its own:
both versions take requests at once, so they cannot hand one cache back and forth as a hot swap
does (memory: two versions' weights and two caches while a canary runs; on a GPU the canary's cache
is the share of the budget kept for it, ``AIENG_CANARY_KV_SHARE``, and a canary that does not fit
is refused before it loads).

Routing (``pick``): ``model: "name@V"`` pins version V (stable or canary); otherwise the
request's key (the ``X-Session-ID`` header, else its request id) is hashed to a point in [0, 1)
and goes to the canary below its weight. The hash is stable, so a session stays on one version
for as long as the weight does not move past its point, and raising the weight only moves
sessions from stable to canary, never back.

Convergence: ``CanaryKeeper.converge`` runs where the hot-swap check runs (the reload poll and
``POST /admin/reload``): it loads, re-weights or unloads the canary to match the store. When the
canary's version becomes ``current`` (a canary that passed), the hot swap switches to the
canary's ``Serving`` as it is: nothing is loaded twice.
"""

from __future__ import annotations

import hashlib
import logging

from aieng.engine import Engine
from aieng.errors import ModelNotFoundError, request_error_codes
from aieng.loading.loader import load_version
from aieng.observability import metrics
from aieng.server.process.gpu_worker import check_canary_fits
from aieng.server.process.serving import Serving
from aieng.store import ModelRef, ModelStore
from aieng.store.canary_record import CanaryRecord, read_canary

log = logging.getLogger("aieng.server.canary")


def assigned_to_canary(key: str, weight: float) -> bool:
    """True when ``key`` falls in the canary's share: its hash's point in [0, 1) is below ``weight``."""
    if weight <= 0.0:
        return False
    point = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return point < weight


def pick(runtime, model: str, key: str) -> Serving:
    """The version a request goes to (see the module docstring)."""
    stable, canary = runtime.serving, runtime.canary
    if "@" in model:
        version = model.split("@", 1)[1]
        for serving in (stable, canary):
            if serving is not None and serving.version == version:
                return serving
        raise ModelNotFoundError(
            f"version {version!r} of {runtime.model_name!r} is not served here (serving "
            f"{stable.version}{'' if canary is None else ' and canary ' + canary.version})",
            param="model",
        )
    if canary is not None and assigned_to_canary(key, runtime.canary_weight):
        return canary
    return stable


class CanaryKeeper:
    def __init__(self, runtime):
        self.runtime = runtime
        self.failed: str | None = None  # a canary version that failed to load: not retried until the record changes
        self.failed_reason = ""  # why, for GET /admin/status (the release waiting on it stops at once)

    def converge(self, *, forced: bool = False) -> dict:
        """Make this worker's canary match the store's record; returns what it serves now."""
        runtime = self.runtime
        record = (
            None
            if runtime.ref.version is not None
            else read_canary(ModelStore(runtime.settings.store), runtime.ref.name)
        )
        canary = runtime.canary
        if record is None or record.version != self.failed:  # a failure is of one record; a new one starts clean
            self.failed, self.failed_reason = None, ""
        if record is None or (canary is not None and canary.version != record.version):
            self._unload()
        if record is not None and runtime.canary is None and (forced or record.version != self.failed):
            self._load(record)
        if runtime.canary is not None and record is not None:
            self._weigh(record.weight)
        return self.describe()

    def describe(self) -> dict:
        canary = self.runtime.canary
        return {} if canary is None else {"version": canary.version, "weight": self.runtime.canary_weight}

    def adopted(self) -> None:
        """The canary became the stable version (a hot swap took its Serving)."""
        canary = self.runtime.canary
        if canary is not None:
            metrics.CANARY_WEIGHT.labels(version=canary.version).set(0)
            metrics.CANARY_LOADED.labels(version=canary.version).set(0)
        self.runtime.canary, self.runtime.canary_weight = None, 0.0

    def _load(self, record: CanaryRecord) -> None:
        runtime = self.runtime
        ref = ModelRef(runtime.ref.name, record.version)
        try:
            store = ModelStore(runtime.settings.store)
            check_canary_fits(runtime, store.manifest(ref).num_parameters, str(ref))  # on a GPU: before loading
            loaded = load_version(store, ref, runtime.load_config())
            engine = Engine(
                loaded.model,
                loaded.tokenizer,
                context_length=loaded.context_length,
                config=runtime.config.canary_engine or runtime.config.engine,  # its own KV cache
                replacing=runtime.serving.engine,
            )
            engine.warmup()
            canary = Serving.build(ref.name, loaded, engine, runtime.config.scheduler, runtime.settings)
        except Exception as exc:  # the stable version keeps all the traffic
            self.failed, self.failed_reason = record.version, str(exc)
            log.error(
                "loading canary %s failed; stable %s keeps all traffic: %s",
                ref,
                runtime.serving.version,
                exc,
                extra={"event": "canary_failed", "to": record.version},
            )
            return
        canary.engine_loop.start()
        metrics.zero_series(canary.version, request_error_codes())
        runtime.canary_weight = 0.0
        runtime.canary = canary
        metrics.CANARY_WEIGHT.labels(version=canary.version).set(0)
        metrics.CANARY_LOADED.labels(version=canary.version).set(1)
        self.failed = None
        log.info(
            "canary %s loaded beside %s",
            ref,
            runtime.serving.version,
            extra={"event": "canary_loaded", "to": record.version, "shared_graphs": engine.shared_graphs},
        )

    def _weigh(self, weight: float) -> None:
        runtime = self.runtime
        if weight != runtime.canary_weight:
            log.info(
                "canary %s weight %.3f -> %.3f",
                runtime.canary.version,
                runtime.canary_weight,
                weight,
                extra={"event": "canary_weight", "to": runtime.canary.version, "weight": weight},
            )
        runtime.canary_weight = weight
        metrics.CANARY_WEIGHT.labels(version=runtime.canary.version).set(weight)

    def _unload(self) -> None:
        runtime = self.runtime
        canary = runtime.canary
        if canary is None:
            return
        runtime.canary_weight = 0.0  # new requests go to stable from here
        runtime.canary = None
        metrics.CANARY_WEIGHT.labels(version=canary.version).set(0)
        metrics.CANARY_LOADED.labels(version=canary.version).set(0)
        finished = canary.retire(timeout_s=runtime.settings.request_timeout_s)
        log.info(
            "canary %s unloaded (%s)",
            canary.version,
            "nothing left in flight" if finished else "timed out waiting for its requests",
            extra={"event": "canary_unloaded", "to": canary.version},
        )

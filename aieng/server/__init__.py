"""The serving front, in two halves that match its two jobs.

- ``http``: one request's trip through the web layer: the FastAPI app and its routes, request and
  response schemas, the error envelope, middleware (trace ids, body limit), server-sent events,
  and the bridge that hands a request to the engine thread and its tokens back to the event loop.
- ``process``: how the service runs on a host: ``aieng serve`` (gunicorn master, preload),
  the uvicorn worker with its graceful drain, the worker plan (how many processes and threads),
  and the per-process runtime (model, engine, scheduler, readiness).
"""

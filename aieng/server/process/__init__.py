"""The process side: ``aieng serve``, gunicorn configuration, the worker, the worker plan, the runtime."""

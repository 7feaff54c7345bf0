"""aieng: serve a language model the way production demands, and teach how.

The package is laid out along the path of one request (docs/architecture.md has the diagram and
the file for each box): ``server.http`` takes HTTP in and streams tokens out, ``scheduler`` owns
every request and decides who runs each step, ``engine`` runs prefill and decode over the
continuously batched KV cache, ``observability`` records metrics, logs and traces, and
``server.process`` is how the service runs on a host (gunicorn master, workers, drain). Around
the path: ``store`` and ``loading`` get verified weights into memory, ``evaluation`` grades a
version and gates its release, ``demo`` builds the offline demo model, ``bench`` measures, and
``cli`` is the ``aieng`` command.
"""

__version__ = "0.1.0"

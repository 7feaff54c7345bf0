"""``aieng loadtest``: production-shaped load against any OpenAI-compatible server.

``workload`` (what to send), ``arrivals`` (when), ``client`` (send and time each request),
``summary`` (percentiles, goodput), ``sweep`` (rates up to saturation, capacity plan), ``checks``
(the server after the run), ``report`` (results.json and the HTML report).
"""

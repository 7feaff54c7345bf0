"""A server a lesson starts is stopped in every outcome, even though a lesson spans many cells.

A notebook starts a real server in one cell and talks to it in the next ones; a ``with`` block
cannot span cells. ``stop_on_failed_cell`` registers the way out the cells in between need: a cell
that raises stops the server at once (IPython's ``post_run_cell`` event), so a lesson that fails
half-way never leaves a server behind it while its kernel lives on (a JupyterLab session, a
papermill run). The kernel's own exit stops it too (``ServerProcess``: atexit and the parent-death
signal), and the lesson's last cell stops it as usual.
"""

from __future__ import annotations


def stop_on_failed_cell(server, ipython=None):
    """Stop ``server`` (a started ``ServerProcess``) when a later cell raises; returns the server.
    Outside IPython (a script) there are no cells: the process exit stops it."""
    if ipython is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return server
        ipython = get_ipython()
    if ipython is None:
        return server

    def after(result) -> None:
        if result.error_in_exec is None and result.error_before_exec is None:
            return
        ipython.events.unregister("post_run_cell", after)
        if server.process is not None and server.process.poll() is None:
            server.stop()
            print(f"a cell failed: the server at {server.base_url} was stopped; run the notebook again from the top")

    ipython.events.register("post_run_cell", after)
    return server


def servers_still_running() -> list[str]:
    """The servers this process started that still run: every descendant process listening on a
    TCP port (an ``aieng serve``, a peer, a load balancer), as ``"pid NAME on PORT"``. A lesson's
    last cell checks it is empty (the book build appends that check to every lesson)."""
    import psutil

    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            ports = sorted({c.laddr.port for c in child.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN})
            if ports:
                left.append(f"pid {child.pid} {child.name()} on {','.join(map(str, ports))}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended while we looked, or not ours to read
    return left

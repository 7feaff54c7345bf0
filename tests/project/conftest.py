"""A registry on loopback for the lock tools' tests: JSON pages by path, 404 elsewhere."""

import http.server
import json
import threading

import pytest


@pytest.fixture
def json_site():
    """``start(pages) -> base URL``: serves ``pages[path]`` as JSON (the path without slashes at its ends)."""
    servers = []

    def start(pages: dict[str, dict]) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                page = pages.get(self.path.strip("/"))
                body = json.dumps(page if page is not None else {}).encode()
                self.send_response(200 if page is not None else 404)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()

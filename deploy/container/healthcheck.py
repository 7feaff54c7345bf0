"""The image's HEALTHCHECK: exit 0 when aieng answers 200 on a health route, 1 otherwise.

    python healthcheck.py [ready|live]      (ready by default)

Standard library only, so it costs a fraction of `aieng`'s start-up and needs no curl in the
image. The port is AIENG_PORT (8000), always asked on loopback inside the container.
"""

import os
import sys
import urllib.error
import urllib.request

ROUTES = {"ready": "/health/ready", "live": "/health/live"}


def main(argv: list[str]) -> int:
    which = argv[1] if len(argv) > 1 else "ready"
    if which not in ROUTES:
        print(f"healthcheck: say ready or live, not {which!r}", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{os.environ.get('AIENG_PORT', '8000')}{ROUTES[which]}"
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return 0 if reply.status == 200 else 1
    except urllib.error.HTTPError as exc:  # 503 while starting or draining: its body says which phase
        print(f"healthcheck: {url} answered {exc.code}: {exc.read(300).decode(errors='replace')}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The HTTP side: routes, schemas, errors, middleware, SSE, and the bridge to the engine thread."""

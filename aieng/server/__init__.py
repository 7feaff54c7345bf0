"""The HTTP front: FastAPI app (routes, validation, error envelope) and how it is started."""

"""The HTTP surface: the Starlette app, serve, JSON-RPC and its methods, the /watch stream, the console."""

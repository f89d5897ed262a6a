"""The HTTP edge: uvicorn with per-connection limits and client pinning (`serve`), the routes that parse a body,
call one service method and serialize (`app`), and the garbage collector's settling once caches are synced.
Imports `pinning`, `verbs` and below."""

"""The HTTP edge: uvicorn with per-connection limits and client pinning, and the metrics port beside it (`serve`), the
routes that parse a body, call one service method and serialize (`app`), the certificates taken up again when their
files change and their expiry (`certificates`, `x509`), and the garbage collector's settling once caches are synced.
Imports `pinning`, `verbs` and below."""

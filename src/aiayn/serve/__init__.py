"""`aiayn serve`: the HTTP app, LibreTranslate's API and aiayn's own (`app`), its handlers'
logic (`handlers`), the request models bounded by the server's limits (`requests`), the guard
and metrics middleware (`guard`), the model worker that batches concurrent requests in turns
(`batcher`, `jobs`) or runs them as continuous batches (`streams`), and starting, running and
draining the server (`launch`).
"""

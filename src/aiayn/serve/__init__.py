"""`aiayn serve`: the HTTP app (LibreTranslate's API and aiayn's own), its handlers' logic,
the request models bounded by the server's limits, the guard and metrics middleware, the model
worker that batches concurrent requests in turns, and running and draining the server.
"""

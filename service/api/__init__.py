"""The HTTP layer: thin routers over the job service, the store and the pools."""

"""`cake serve`: an OpenAI-compatible HTTP server over the task pipeline (`tasks.pipeline`), one model
loaded once, documents answered from their compressed caches (see docs/serve.md)."""

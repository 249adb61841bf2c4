"""Tracing and metrics for toolspan; the gateway reaches it only through `Instrumentation`."""

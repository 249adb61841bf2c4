"""Tracing and metrics for toolspan. The gateway reaches them only through the `Instrumentation`
it is handed (telemetry.instrument.Telemetry)."""

"""What the coordinator tells operators: Prometheus metrics, OpenTelemetry tracing, log setup."""

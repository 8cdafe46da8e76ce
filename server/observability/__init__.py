"""Statistics (Triton's statistics extension) and Prometheus metrics, derived from the same records."""

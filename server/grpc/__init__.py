"""KServe v2 / Triton gRPC front end."""

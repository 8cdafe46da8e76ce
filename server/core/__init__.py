"""Transport-neutral core: request types, errors, the model registry and its lifecycle."""

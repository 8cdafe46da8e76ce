"""The Python backend's server end: what runs in the server process (the backend itself, a stub's
process and instance as the server sees them, the in-process instance, execution environments)."""

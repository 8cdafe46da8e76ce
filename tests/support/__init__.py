"""Shared helpers for tests: real server processes on free ports, model repositories."""

"""Test-only backends for kubeinfer, installed as a separate distribution so the entry-point path is real."""

"""The stub process (``stub_boot.py``, ``stub``) and the model runner (``runner``, ``loader``) it shares
with the server's in-process instance. Stub-safe: standard library and numpy only, and nothing from
``server_side`` (a stub may run under a model's own interpreter, where kubeinfer is not installed)."""

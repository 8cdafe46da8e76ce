"""The model repository on disk: its layout rules and how it is read.

This is the volume contract between operator and server (the operator writes what the server reads),
so it sits in the bottom layer with the config schema: the operator may import it, it imports nothing
from the runtime.
"""

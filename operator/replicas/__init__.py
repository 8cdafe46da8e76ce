"""The server replicas as the operator sees them: which pods are a pool's own, how to call them (token, TLS),
what each serves (repository indexes), bounded answers, nudges after a render.
"""

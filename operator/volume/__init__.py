"""The repository volume: each namespace's own claim and folder, and the writer that puts a rendered model
into a pool's folder following the server's staged-fsync-rename contract.
"""

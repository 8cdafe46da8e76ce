"""Where model files come from: one guarded downloader for every scheme, shared by the server and the operator.

``egress`` holds the address and host rules, ``guard`` the connection layer that applies them to every
connection any scheme makes (https, S3, OCI registries), ``uris`` the parsed form of a source URI, and one
module per store speaks that store's protocol through the guard. The operator fetches a version's files
onto the repository volume with it; the server reads a cloud model repository with it.
"""

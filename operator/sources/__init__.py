"""Model files from where they live: the volume, ``https`` URLs and the stores (S3, GCS, Azure, Hugging Face,
OCI) through the server's one guarded downloader; archives, credentials, download slots and quotas, the early
ONNX check. Knows nothing of pools or replicas.
"""

"""KServe v2 REST front end (FastAPI on uvicorn) with Triton's binary tensor extension."""

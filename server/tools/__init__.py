"""Command-line tools around the server (``kubeinfer convert``)."""

"""A sibling package."""

"""An InferenceModel's render and its life after it: spec → config.pbtxt, the render memo, cold start in the
status, retries of a failed render, rechecks and whether a render was superseded.
"""

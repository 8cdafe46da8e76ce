"""Where requests go and how many replicas take them: canary weights and rollout decisions, autoscaling (HPA,
KEDA, scale to zero through the HTTP add-on), routed host names and sequence affinity.
"""

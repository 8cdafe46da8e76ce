"""An InferenceServer's Kubernetes objects: Deployment and Service manifests, its NetworkPolicy, the image
policy, the model cache flags and how each pod started. Pure functions of the custom object.
"""

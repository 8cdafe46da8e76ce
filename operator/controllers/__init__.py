"""The reconciles on top of the wings: the InferenceServer and InferenceModel reconciles, the Reconciler that
runs them from watch events, a work queue and a resync pass, the operator's settings, and the kopf wiring.
"""

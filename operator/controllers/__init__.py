"""The controllers on top of the wings: the InferenceServer and InferenceModel controllers (composed, each handed
the parts they share), one record per model, the Reconciler that runs them from watch events, a work queue and a
resync pass, the operator's settings, and the kopf wiring.
"""

"""The runtime that orchestrates: model lifecycle (states, load, drain, unload), the registry that routes
requests to ready versions, the repository watcher and the ``InferenceService`` the front ends call.
"""

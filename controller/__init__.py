"""The controller: starts one harness run per rollout attempt, watches it, records how it ended.

spec.py (what to run), launcher.py (the launcher protocol and local processes), manifests.py
and kube.py (Kubernetes Jobs), loop.py (`agl controller`), jobs.py (`agl jobs render`).
"""

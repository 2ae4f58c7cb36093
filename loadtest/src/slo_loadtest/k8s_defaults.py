"""Defaults shared by `k8s start` (its options) and the Job it builds, kept apart from k8s.py so
that the CLI imports without the kubernetes client (a local sweep never needs it)."""

# The chart's loadtest.resources defaults, so `k8s start` and the chart run the same pod. Requests
# keep the pod out of BestEffort (first evicted, no CPU guaranteed); guidellm's workers and the
# media process pool need several cores, and a starved client falls behind, which makes rates
# inconclusive. No CPU limit: throttling would do the same; a memory limit bounds the node's risk.
DEFAULT_CPU, DEFAULT_MEMORY = "4", "4Gi"

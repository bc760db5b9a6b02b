"""The rules a run is held to: policy, limits, per-principal quotas, quarantine, run keys."""

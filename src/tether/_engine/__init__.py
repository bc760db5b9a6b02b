"""Runs: execute, pause, resume, recover; the effect boundary, policy and journal decisions."""

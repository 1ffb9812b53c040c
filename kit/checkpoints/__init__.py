"""Checkpoints: manifests, stores, background sync, the lease, resume, status and the goodput ledger."""

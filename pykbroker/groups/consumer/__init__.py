"""The consumer group protocol (KIP-848): server-side assignment, member epochs, reconciliation."""

"""minialign: a small, exact NumPy replication of "good views vs next-token prediction"."""

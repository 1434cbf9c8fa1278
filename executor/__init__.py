"""paraplan."""

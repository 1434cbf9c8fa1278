"""paraplan.executor: apply a plan with native PyTorch distributed (issue 5; imports torch).
Nothing is implemented yet: plans are produced and explained, not executed."""

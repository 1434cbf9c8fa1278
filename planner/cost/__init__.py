"""The cost model: compute, communication and memory of a strategy (docs/cost-model.md)."""

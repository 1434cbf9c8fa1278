"""Adapters from Hugging Face models to `ChainModule`s with tensor-parallel plans for their
blocks (`executor.convert` picks one)."""

"""Adapters from Hugging Face models to `Chain`s with tensor-parallel plans for their blocks."""

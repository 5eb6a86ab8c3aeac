"""Datasets, loaders and the vertical splitter."""

"""The GPU stage: what runs on a GPU machine after a build (which has none)."""

"""A decoder-only language model at work: generation (`Generator`) and scoring text."""

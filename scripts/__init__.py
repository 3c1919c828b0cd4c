"""Tools run from the repository root as modules (`python -m scripts.screenshots`), beside shell scripts."""

"""The operators' API under /api/ops/v1/ (docs/api.md): personal tokens, reads and actions for scripts."""

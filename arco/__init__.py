"""ARCO: a rubric model sharing the policy's backbone, co-evolving with it (arco/README.md)."""

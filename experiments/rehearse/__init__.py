"""Paper configs rehearsed on a CPU: each config's whole pipeline, as a user runs it, with only the
model (a shrunken stand-in of the same architecture with the real tokenizer), the data (a few rows
in the paper data's own formats), retrieval and the LLM endpoints (loopback servers) and the sizes
replaced. ``python -m experiments.rehearse --config <paper config>``."""

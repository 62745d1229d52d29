"""EviBack: GRPO for a search agent where all-zero groups get an evidence-constrained reward from
a two-stage teacher (``teacher``, ``reward``), plus E2E-APE to build that teacher's prompts
(``prompts``, ``ape``). The evidence oracle (``oracle``) labels data that has supporting documents.
"""

"""A real pretrained model and real questions for a laptop: SmolLM2-135M-Instruct (``model``)
and 250 HotpotQA distractor questions with their paragraphs (``data``). README.md: sources and
licences."""

"""The tiny CER tasks the project generates: ``alias`` (reading comprehension whose answers have
aliases; the default), ``arithmetic`` (numbers in several surface forms), and ``build`` (a task's
files plus a tokenizer and a tiny Qwen3 trained on them: ``python -m cer build-tiny``)."""

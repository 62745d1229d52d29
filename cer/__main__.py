from cer.cli import run

run()

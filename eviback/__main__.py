from eviback.cli import run

run()

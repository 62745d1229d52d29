from arco.cli import run

run()

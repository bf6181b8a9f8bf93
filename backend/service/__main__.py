"""`python -m backend.service [--port N] [--workdir DIR] ...`: the server alone, with the options of
`python -m backend serve`; the add-on starts it so, its zip holding no tools."""
import sys

from .arguments import Parser, add_serve_arguments, run
from .server import serve

parser = Parser(prog="python -m backend.service", description="Splatwright backend server")
add_serve_arguments(parser)
sys.exit(run(serve, parser.parse_args()))

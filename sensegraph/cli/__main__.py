"""`python -m sensegraph.cli ...`, as the `sensegraph` script."""
from . import main

main()

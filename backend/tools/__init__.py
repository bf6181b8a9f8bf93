"""The backend's tools: the command line (cli.py), the demo and the benchmarks (bench/), built on the library and
the service; the add-on's zip holds none of them."""

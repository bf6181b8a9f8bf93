"""Splatwright's backend, in three parts that import downward only: the library (the modules here and data/,
formats/, render/: the Gaussian model, its formats, datasets, renderers, kernels and trainer), the service
(service/: the server and its engine) and the tools (tools/: the command line, the demo and the benchmarks).
`python -m backend` runs the command line; the add-on starts `python -m backend.service`."""

"""polyc's benchmark suite: ``python -m benchmarks --help``.

This package imports nothing on purpose: ``python -m benchmarks`` must be able to clear the
OpenBLAS variables before numpy is first imported (see ``__main__``).
"""

"""polyc: a polyhedral compiler for Tensor-Comprehensions-style tensor kernels."""
from polyc.errors import PolycError

__version__ = "0.1.0"

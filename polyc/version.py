"""polyc's version, in a module of its own so that any layer may read it without importing the
package's public API (``polyc/__init__.py`` imports the API, which imports every layer)."""

__version__ = "0.1.0"

"""The one place mnntool's version is written: pyproject.toml reads `__version__` from here at build time
(setuptools' `attr:`, parsed without importing the package), and `mnntool --version`, the reports'
`mnntool_version` and `mnntool.__version__` import it.

`MNN_FORMAT_VERSION` is the MNN release whose schema (schema/default/*.fbs) the files mnntool writes
follow and whose runtime (the `mnn` wheel) the test suite loads them in; the writer stores it in
`Net.extraInfo.version`, where MNN's own converter stores its version (`Interpreter.getModelVersion()`
reads it back)."""

__version__ = "0.1.0"
MNN_FORMAT_VERSION = "3.6.1"

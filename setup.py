"""Build script for the optional C accelerator; all other metadata lives in pyproject.toml.

pykbroker/_speedups.c is the C twin of the record walk in pykbroker/protocol/records.py. It is
``optional``: where no C compiler exists the build carries on without it and the pure-Python twin runs.
In a checkout, ``python3 setup.py build_ext --inplace`` builds it next to the sources.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("pykbroker._speedups", ["pykbroker/_speedups.c"], optional=True)])

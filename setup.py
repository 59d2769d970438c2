"""Packaging that pyproject.toml cannot express: the committed tuning databases are edited in the
top-level ``tune_logs/`` and ship inside the package as ``tvm_canary/tune_logs/`` (the package-dir
mapping below), where an installed copy finds them with ``importlib.resources``
(``tvm_canary.tuning.keys.committed_tune_logs``). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["tvm_canary", "tvm_canary.*"]) + ["tvm_canary.tune_logs"],
    package_dir={"tvm_canary.tune_logs": "tune_logs"},
    package_data={"tvm_canary.tune_logs": ["*/*.json", "*/*.json.gz"]},
)

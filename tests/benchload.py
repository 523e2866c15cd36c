"""Import benchmarks/gpu_checks/<module> in a test without putting benchmarks/ on sys.path: there,
benchmarks/crosscheck.py would shadow tests/crosscheck.py for the rest of the pytest session."""
import importlib
import importlib.util
import sys
from pathlib import Path

CHECKS = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_checks"


def gpu_checks(module: str):
    if "gpu_checks" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_checks", CHECKS / "__init__.py",
                                                      submodule_search_locations=[str(CHECKS)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["gpu_checks"] = pkg
        spec.loader.exec_module(pkg)
    return importlib.import_module(f"gpu_checks.{module}")

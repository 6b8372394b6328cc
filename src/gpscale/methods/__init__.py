"""Inference families behind the Method contract, and the registry of method keys."""

from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.registry import METHODS, MethodSpec, build, get_spec, register

__all__ = ["Method", "MethodSpec", "METHODS", "build", "get_spec", "register", "predict_in_chunks"]

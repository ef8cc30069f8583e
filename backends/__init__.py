"""Execution backends, installed as ``edgeinfer.backends``: one package per engine."""

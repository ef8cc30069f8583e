"""Model converters, installed as ``edgeinfer.converters``: one package per source framework."""

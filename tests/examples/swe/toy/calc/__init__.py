from calc.core import add, sub

__all__ = ["add", "sub"]

"""Helpers shared by the store tests (a module of its own: `conftest` names are ambiguous across test dirs)."""


def body_for(i: int) -> bytes:
    # Varying sizes, so records do not line up with segment ends by accident.
    return f"message-{i};".encode() * (1 + i % 7)
